//! Which shard builds which model: greedy longest-processing-time (LPT) scheduling over the estimated
//! costs. Models go largest first (ties by name) to the least-loaded shard (ties by the lowest index).
//! The result depends only on the set of (name, cost) pairs, not on their order, so every shard of a build
//! computes the same assignment independently. LPT's makespan is at most (4/3 - 1/(3N)) of the optimum.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One model to place: its name (unique within a build) and its estimated cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Weighted {
    pub name: String,
    pub cost: u64,
}

/// The shard of each job, in the order of `jobs`, for `count` shards (`count >= 1`; a count of 0 is
/// treated as 1). Shards beyond the number of jobs get nothing.
pub fn assign(jobs: &[Weighted], count: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| jobs[b].cost.cmp(&jobs[a].cost).then_with(|| jobs[a].name.cmp(&jobs[b].name)));
    // Only the first min(count, jobs) shards can receive a job: LPT fills empty shards lowest index first.
    let used = count.max(1).min(jobs.len());
    let mut loads: BinaryHeap<Reverse<(u64, usize)>> = (0..used).map(|s| Reverse((0, s))).collect();
    let mut shard_of = vec![0; jobs.len()];
    for j in order {
        let Some(Reverse((load, s))) = loads.pop() else { break };
        shard_of[j] = s;
        loads.push(Reverse((load.saturating_add(jobs[j].cost), s)));
    }
    shard_of
}

/// The total estimated cost on each of `count` shards under `shard_of`.
pub fn loads(jobs: &[Weighted], shard_of: &[usize], count: usize) -> Vec<u64> {
    let mut l = vec![0u64; count];
    for (j, &s) in jobs.iter().zip(shard_of) {
        l[s] = l[s].saturating_add(j.cost);
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn weighted(costs: &[u64]) -> Vec<Weighted> {
        costs.iter().enumerate().map(|(i, &c)| Weighted { name: format!("m{i:03}"), cost: c }).collect()
    }

    /// The smallest makespan of any assignment, by brute force (small instances only).
    fn optimum(costs: &[u64], count: usize) -> u64 {
        fn go(costs: &[u64], loads: &mut Vec<u64>, best: &mut u64) {
            let Some((&c, rest)) = costs.split_first() else {
                *best = (*best).min(*loads.iter().max().unwrap());
                return;
            };
            let mut tried = Vec::new();
            for s in 0..loads.len() {
                // Shards with equal loads are interchangeable: try one of them.
                if tried.contains(&loads[s]) {
                    continue;
                }
                tried.push(loads[s]);
                loads[s] += c;
                if loads[s] < *best {
                    go(rest, loads, best);
                }
                loads[s] -= c;
            }
        }
        let mut best = u64::MAX;
        go(costs, &mut vec![0; count], &mut best);
        best
    }

    #[test]
    fn largest_first_to_the_least_loaded_shard() {
        let jobs = weighted(&[5, 4, 3, 3, 3]);
        // 5 -> 0, 4 -> 1, 3 (m002) -> 1 (load 4 < 5), 3 (m003) -> 0, 3 (m004) -> 1 (7 < 8).
        assert_eq!(assign(&jobs, 2), [0, 1, 1, 0, 1]);
        assert_eq!(loads(&jobs, &assign(&jobs, 2), 2), [8, 10]);
        // Ties between equal costs go by name, ties between equal loads to the lowest index.
        assert_eq!(assign(&weighted(&[1, 1, 1]), 3), [0, 1, 2]);
        // More shards than jobs: the extra shards are empty; no jobs, no work.
        assert_eq!(assign(&weighted(&[2, 9]), 5), [1, 0]);
        assert_eq!(assign(&[], 4), Vec::<usize>::new());
    }

    fn instance(max_jobs: usize, max_cost: u64) -> impl Strategy<Value = (Vec<u64>, usize)> {
        (prop::collection::vec(0..max_cost, 0..max_jobs), 1usize..6)
    }

    proptest! {
        #[test]
        fn every_job_lands_in_exactly_one_existing_shard((costs, count) in instance(40, 1_000_000)) {
            let jobs = weighted(&costs);
            let a = assign(&jobs, count);
            prop_assert_eq!(a.len(), jobs.len());
            prop_assert!(a.iter().all(|&s| s < count));
            prop_assert_eq!(loads(&jobs, &a, count).iter().sum::<u64>(), costs.iter().sum::<u64>());
            // The same input gives the same assignment.
            prop_assert_eq!(assign(&jobs, count), a);
        }

        #[test]
        fn the_order_of_the_jobs_does_not_matter((costs, count) in instance(40, 100), seed in any::<u64>()) {
            let jobs = weighted(&costs);
            let a = assign(&jobs, count);
            // A seeded shuffle (costs up to 100 so that equal costs, broken by name, are common).
            let mut perm: Vec<usize> = (0..jobs.len()).collect();
            let mut x = seed | 1;
            for i in (1..perm.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                perm.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let shuffled: Vec<Weighted> = perm.iter().map(|&i| jobs[i].clone()).collect();
            let b = assign(&shuffled, count);
            for (k, &i) in perm.iter().enumerate() {
                prop_assert_eq!(b[k], a[i], "job {} moved shards when the input was reordered", jobs[i].name);
            }
        }

        #[test]
        fn the_makespan_is_within_the_lpt_bound_of_the_optimum((costs, count) in instance(9, 1000)) {
            let jobs = weighted(&costs);
            let makespan = loads(&jobs, &assign(&jobs, count), count).into_iter().max().unwrap_or(0);
            let opt = optimum(&costs, count);
            // Graham: LPT <= (4/3 - 1/(3N)) * OPT, in integers.
            prop_assert!(3 * count as u64 * makespan <= (4 * count as u64 - 1) * opt, "makespan {makespan}, optimum {opt}, {count} shards");
        }

        #[test]
        fn large_zoos_stay_within_the_list_scheduling_bound((costs, count) in instance(300, 1_000_000_000)) {
            let jobs = weighted(&costs);
            let makespan = loads(&jobs, &assign(&jobs, count), count).into_iter().max().unwrap_or(0);
            let (total, biggest) = (costs.iter().sum::<u64>(), costs.iter().copied().max().unwrap_or(0));
            // The optimum is at least max(total / N, biggest job); LPT is at most total / N + biggest job.
            let lower = total.div_ceil(count as u64).max(biggest);
            prop_assert!(makespan >= lower);
            prop_assert!(count as u64 * makespan <= total + (count as u64 - 1) * biggest, "makespan {makespan}, lower bound {lower}");
        }
    }
}
