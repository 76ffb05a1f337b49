"""The installed package is typed (PEP 561): py.typed ships, and the stubs of the extension declare exactly the
names it exports, with compile's keyword arguments as the extension takes them."""

import ast
import inspect
from pathlib import Path

import tessera
from tessera import _tessera


def stub_tree():
    path = Path(tessera.__file__).parent / "_tessera.pyi"
    assert path.is_file(), f"{path} is not installed"
    return ast.parse(path.read_text())


def test_the_package_ships_py_typed_and_stubs():
    assert (Path(tessera.__file__).parent / "py.typed").is_file()
    stub_tree()


def test_the_stubs_declare_exactly_the_extension_names():
    tree = stub_tree()
    declared = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
    exported = {n for n in dir(_tessera) if not n.startswith("_") or n == "__version__"}
    assert exported <= declared, f"not in the stubs: {sorted(exported - declared)}"
    public_declared = {n for n in declared if not n.startswith("_") or n == "__version__"}
    # compile and cli_main are absent from a runtime-only build (the `compiler` feature off).
    assert public_declared <= exported | {"compile", "cli_main"}, f"stubbed but not exported: {sorted(public_declared - exported)}"
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    methods = {n.name for n in model.body if isinstance(n, ast.FunctionDef)}
    assert methods == {n for n in dir(_tessera.Model) if not n.startswith("_")}


def test_compile_keywords_match_the_extension():
    if not hasattr(_tessera, "compile"):
        return
    tree = stub_tree()
    stub = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "compile")
    stub_kw = [a.arg for a in stub.args.kwonlyargs]
    sig = inspect.signature(_tessera.compile)
    real_kw = [p.name for p in sig.parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY]
    assert stub_kw == real_kw
