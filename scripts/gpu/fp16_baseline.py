# PyTorch's own fp16 error (model.half() against fp32, on the GPU) on beyond_zoo.py models, by name: whether a
# tessera fp16 row over 1e-2 is the model's sensitivity. Usage: python3 scripts/gpu/fp16_baseline.py MODEL...
import sys, json
sys.path.insert(0, "scripts/gpu")
import numpy as np, torch
import beyond_zoo as bz
out = {}
for name in sys.argv[1:]:
    model, inputs, _ = bz.build(name)
    args = [torch.from_numpy(v) for v in inputs.values()]
    with torch.no_grad():
        m32 = model.cuda().float()
        want = m32(*[a.cuda() for a in args])[0].float().cpu().numpy()
        m16 = model.half()
        got = m16(*[a.cuda().half() if a.is_floating_point() else a.cuda() for a in args])[0].float().cpu().numpy()
    err = float(np.abs(got - want).max() / np.abs(want).max())
    out[name] = err
    print(name, f"torch fp16 vs torch fp32: {err:.3e}", flush=True)
print(json.dumps(out))
