use super::*;
use proptest::prelude::*;

fn cand(target: usize, nodes: &[u32]) -> Candidate {
    Candidate { target, nodes: nodes.iter().map(|&n| NodeId(n)).collect() }
}

/// The search over candidates that each cover one node: per group, the cheapest finite one (what the
/// shortest-path search finds when no candidate spans two nodes and nothing crosses devices).
fn search(plan: &Plan, costs: &[f64]) -> Vec<usize> {
    plan.groups
        .iter()
        .filter_map(|m| m.iter().copied().filter(|&i| costs[i].is_finite()).min_by(|&a, &b| costs[a].total_cmp(&costs[b]).then(a.cmp(&b))))
        .collect()
}

/// Runs the rounds against `truth` (each candidate's real time): what was measured, and the final plan.
fn rounds(plan: &Plan, truth: &[f64]) -> (Vec<Option<f64>>, Vec<usize>) {
    let mut seen = BTreeSet::new();
    let mut measure = |which: &[usize]| -> Result<Vec<f64>> {
        for &i in which {
            assert!(seen.insert(i), "candidate {i} measured twice");
        }
        Ok(which.iter().map(|&i| truth[i]).collect())
    };
    let r = plan.rounds(&mut measure, &|costs: &[f64]| Ok(search(plan, costs))).unwrap();
    (r.times, r.winners)
}

#[test]
fn a_candidate_estimated_far_behind_is_not_measured() {
    // Five nodes only target 1 runs (its probes: calibration 1.0), and node 9 on both targets: target 0
    // estimated 10, target 1 estimated 100, and so they measure.
    let cands: Vec<Candidate> = (0..5).map(|n| cand(1, &[n])).chain([cand(0, &[9]), cand(1, &[9])]).collect();
    let truth = [1.0, 1.0, 1.0, 1.0, 1.0, 10.0, 100.0];
    let plan = Plan::new(&cands, &truth);
    let (times, winners) = rounds(&plan, &truth);
    assert_eq!(times[6], None, "estimated ten times behind on a calibrated target: {times:?}");
    assert_eq!(winners, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(times.iter().filter(|t| t.is_some()).count(), 6, "the plan's six, measured in rounds: {times:?}");
}

#[test]
fn a_badly_calibrated_backend_is_measured_where_it_can_win() {
    // Target 1's estimates are ten times too slow: its probes calibrate it, and the rounds measure it
    // wherever it wins.
    let cands: Vec<Candidate> = (0..6).flat_map(|n| [cand(0, &[n]), cand(1, &[n])]).collect();
    let est: Vec<f64> = (0..6).flat_map(|_| [10.0, 40.0]).collect();
    let truth: Vec<f64> = (0..6).flat_map(|_| [10.0, 4.0]).collect();
    let plan = Plan::new(&cands, &est);
    let (_, winners) = rounds(&plan, &truth);
    assert_eq!(winners, vec![1, 3, 5, 7, 9, 11], "target 1 wins every node");
}

#[test]
fn the_plans_candidates_and_their_close_rivals_are_tuned() {
    let cands = [cand(0, &[0]), cand(1, &[0]), cand(2, &[0])];
    let plan = Plan::new(&cands, &[1.0, 1.0, 1.0]);
    assert_eq!(plan.competitive(&[0], &[Some(10.0), Some(19.0), Some(21.0)]), vec![0, 1]);
    assert_eq!(plan.competitive(&[0], &[Some(10.0), None, Some(f64::INFINITY)]), vec![0]);
}

proptest! {
    /// Whatever the estimates and times: the rounds end on a plan of measured candidates that beats
    /// every unmeasured candidate's calibrated estimate (what the final search sees).
    #[test]
    fn the_final_plan_is_measured_and_no_estimate_beats_it(
        spec in proptest::collection::vec((0usize..3, 0u32..6, 0.1f64..100.0, 0.1f64..100.0), 1..40)
    ) {
        let cands: Vec<Candidate> = spec.iter().map(|&(t, n, _, _)| cand(t, &[n])).collect();
        let est: Vec<f64> = spec.iter().map(|s| s.2).collect();
        let truth: Vec<f64> = spec.iter().map(|s| s.3).collect();
        let plan = Plan::new(&cands, &est);
        let (times, winners) = rounds(&plan, &truth);
        let calibrated = plan.calibrated(&times);
        let finals: Vec<f64> = times.iter().zip(&calibrated).map(|(t, c)| t.unwrap_or(*c)).collect();
        prop_assert_eq!(search(&plan, &finals), winners.clone());
        for &w in &winners {
            prop_assert!(times[w].is_some(), "winner {} unmeasured", w);
        }
    }

    /// Where every backend's estimates are off by one factor of its own, pruning finds the plan full
    /// measurement finds.
    #[test]
    fn estimates_off_by_a_factor_per_backend_give_the_full_plan(
        spec in proptest::collection::vec((0usize..3, 0u32..8, 0.1f64..100.0), 1..48),
        factors in proptest::collection::vec(0.05f64..20.0, 3)
    ) {
        let cands: Vec<Candidate> = spec.iter().map(|&(t, n, _)| cand(t, &[n])).collect();
        let truth: Vec<f64> = spec.iter().map(|s| s.2).collect();
        let est: Vec<f64> = spec.iter().map(|s| s.2 * factors[s.0]).collect();
        let plan = Plan::new(&cands, &est);
        let (_, winners) = rounds(&plan, &truth);
        let full = search(&plan, &truth);
        let cost = |w: &[usize]| w.iter().map(|&i| truth[i]).sum::<f64>();
        prop_assert!((cost(&winners) - cost(&full)).abs() < 1e-9, "pruned {:?} vs full {:?}", winners, full);
    }
}
