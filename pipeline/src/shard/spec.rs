//! The `--shard` argument: `I/N` (shard I of N, counted from 0) or `auto/N`, where I comes from the job
//! engine's environment: `JOB_COMPLETION_INDEX` (a Kubernetes Indexed Job), else `SLURM_ARRAY_TASK_ID`
//! (a Slurm array; minus `SLURM_ARRAY_TASK_MIN` when that is set, so `--array=1-3` gives 0, 1, 2).

use anyhow::{bail, Context, Result};
use std::fmt;
use std::str::FromStr;

/// One shard of a build: `index` in `0..count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// Shard `index` of `count`, checked.
    pub fn new(index: usize, count: usize) -> Result<Self> {
        if count == 0 {
            bail!("the shard count must be at least 1, got 0");
        }
        if index >= count {
            bail!("shard index {index} is out of range: shards are numbered from 0 to {} for {count} shards", count - 1);
        }
        Ok(Shard { index, count })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// `--shard` as given: a fixed index, or one to read from the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardArg {
    Fixed(Shard),
    Auto { count: usize },
}

/// The environment variables `auto/N` reads, in order of preference.
pub const INDEX_VARS: [&str; 2] = ["JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID"];

impl FromStr for ShardArg {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let (i, n) = s.split_once('/').with_context(|| format!("expected I/N (shard I of N, from 0) or auto/N, got '{s}'"))?;
        let count = parse_number(n).with_context(|| format!("the shard count '{n}' is not a number"))?;
        if count == 0 {
            bail!("the shard count must be at least 1, got 0");
        }
        if i.trim() == "auto" {
            return Ok(ShardArg::Auto { count });
        }
        let index = parse_number(i).with_context(|| format!("the shard index '{i}' is not a number (or 'auto')"))?;
        Ok(ShardArg::Fixed(Shard::new(index, count)?))
    }
}

fn parse_number(s: &str) -> Result<usize> {
    let t = s.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        bail!("expected a non-negative integer");
    }
    Ok(t.parse::<usize>()?)
}

impl ShardArg {
    /// The shard this process builds; `env` looks a variable up (`std::env::var(..).ok()` in the CLI).
    /// Errors name the flag and, for `auto`, the variable at fault.
    pub fn resolve(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Shard> {
        let count = match self {
            ShardArg::Fixed(s) => return Ok(s),
            ShardArg::Auto { count } => count,
        };
        let flag = format!("--shard auto/{count}");
        if let Some(v) = env("JOB_COMPLETION_INDEX") {
            let index = parse_number(&v).with_context(|| format!("{flag}: JOB_COMPLETION_INDEX='{v}' is not a shard index"))?;
            return Shard::new(index, count).with_context(|| format!("{flag}: JOB_COMPLETION_INDEX={v}"));
        }
        if let Some(v) = env("SLURM_ARRAY_TASK_ID") {
            let id = parse_number(&v).with_context(|| format!("{flag}: SLURM_ARRAY_TASK_ID='{v}' is not a shard index"))?;
            let (min, from) = match env("SLURM_ARRAY_TASK_MIN") {
                Some(m) => {
                    let min = parse_number(&m).with_context(|| format!("{flag}: SLURM_ARRAY_TASK_MIN='{m}' is not a number"))?;
                    (min, format!("SLURM_ARRAY_TASK_ID={v} minus SLURM_ARRAY_TASK_MIN={m}"))
                }
                None => (0, format!("SLURM_ARRAY_TASK_ID={v}")),
            };
            let index = id.checked_sub(min).with_context(|| format!("{flag}: {from} is negative"))?;
            return Shard::new(index, count).with_context(|| format!("{flag}: {from}"));
        }
        bail!("{flag}: neither {} is set; give the index yourself with --shard I/{count}", INDEX_VARS.join(" nor "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn fixed_shards_parse_and_are_checked() {
        assert_eq!("2/3".parse::<ShardArg>().unwrap(), ShardArg::Fixed(Shard { index: 2, count: 3 }));
        assert_eq!("0/1".parse::<ShardArg>().unwrap(), ShardArg::Fixed(Shard { index: 0, count: 1 }));
        for (bad, says) in [
            ("3/3", "0 to 2"),
            ("0/0", "at least 1"),
            ("1", "expected I/N"),
            ("a/3", "'a' is not a number"),
            ("1/b", "'b' is not a number"),
            ("-1/3", "not a number"),
            ("1/3/4", "not a number"),
            ("/3", "not a number"),
            ("99999999999999999999999/3", "not a number"),
        ] {
            let e = format!("{:#}", bad.parse::<ShardArg>().unwrap_err());
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn auto_reads_the_job_engines_index() {
        let auto = "auto/3".parse::<ShardArg>().unwrap();
        assert_eq!(auto, ShardArg::Auto { count: 3 });
        let k8s = [("JOB_COMPLETION_INDEX", "2"), ("SLURM_ARRAY_TASK_ID", "0")];
        assert_eq!(auto.resolve(&env(&k8s)).unwrap(), Shard { index: 2, count: 3 });
        assert_eq!(auto.resolve(&env(&[("SLURM_ARRAY_TASK_ID", "1")])).unwrap().index, 1);
        let slurm_from_one = [("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_ARRAY_TASK_MIN", "1")];
        assert_eq!(auto.resolve(&env(&slurm_from_one)).unwrap().index, 2);
        // A fixed index ignores the environment.
        assert_eq!("1/3".parse::<ShardArg>().unwrap().resolve(&env(&k8s)).unwrap().index, 1);
    }

    #[test]
    fn auto_errors_name_the_flag_and_the_variable() {
        let auto = ShardArg::Auto { count: 3 };
        for (vars, says) in [
            (&[][..], "neither JOB_COMPLETION_INDEX nor SLURM_ARRAY_TASK_ID is set"),
            (&[("JOB_COMPLETION_INDEX", "3")][..], "JOB_COMPLETION_INDEX=3"),
            (&[("JOB_COMPLETION_INDEX", "x")][..], "JOB_COMPLETION_INDEX='x'"),
            (&[("SLURM_ARRAY_TASK_ID", "4"), ("SLURM_ARRAY_TASK_MIN", "1")][..], "SLURM_ARRAY_TASK_ID=4 minus SLURM_ARRAY_TASK_MIN=1"),
            (&[("SLURM_ARRAY_TASK_ID", "0"), ("SLURM_ARRAY_TASK_MIN", "1")][..], "is negative"),
            (&[("SLURM_ARRAY_TASK_ID", "1"), ("SLURM_ARRAY_TASK_MIN", "?")][..], "SLURM_ARRAY_TASK_MIN='?'"),
        ] {
            let e = format!("{:#}", auto.resolve(&env(vars)).unwrap_err());
            assert!(e.starts_with("--shard auto/3: ") && e.contains(says), "{vars:?}: {e}");
        }
    }
}
