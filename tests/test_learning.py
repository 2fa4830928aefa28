"""Full training runs: the default config solves CartPole-v1 (slow; CI runs them with -m slow)."""
import csv

import pytest

import pearl
from pearl.config import default_config_path, load_config
from pearl.kernels.cpu.backend import bf16_products


@pytest.mark.slow
@pytest.mark.parametrize("runtime, precision", [("sequential", "fp32"), ("processes", "fp32"), ("sequential", "bf16")])
def test_default_config_solves_cartpole(runtime, precision, tmp_path):
    """Every seed reaches the solved level (a periodic greedy eval >= 475, the level
    benchmarks/time_to_solve.py times; with actor processes 2 of 3 seeds, as docs/BENCHMARKS.md
    says); the sequential runtime also ends there on 2 of 3 seeds.
    bf16: the fused learner's inner hidden layer (64 x 64) in bfloat16 products."""
    config = load_config(default_config_path())
    reached, ended = [], []
    for seed in (0, 1, 2):
        agent = pearl.DQN(config=config, seed=seed, plan=pearl.Plan(runtime=runtime, learner_precision=precision))
        assert agent.learner.precision == precision
        agent.train(run_dir=tmp_path / str(seed))
        with open(tmp_path / str(seed) / "metrics.csv", newline="") as f:
            evals = [float(row["eval_return"]) for row in csv.DictReader(f) if row["eval_return"]]
        assert len(evals) == config.total_steps // config.eval.interval
        reached.append(max(evals) >= 475)
        ended.append(agent.evaluate(10)["mean"] >= 475)
    # Bit-exact trajectories can differ across CPUs (BLAS kernels): one seed may end elsewhere. The
    # processes runtime is not deterministic (the actor's weights trail the learner by up to its
    # allowance) and a vanilla DQN's final greedy policy swings between ~150 and 500 from one
    # update to the next (docs/BENCHMARKS.md, issue 19's 20 seeds), so its end is not asserted, and
    # one of its seeds may miss the level in every periodic eval of a run: [False, True, True] in 2
    # of 16 runs of this test on the 2-core EPYC (session 28; 0 of 24 at 175e8c9, p = 0.15).
    # bf16 on a CPU without bfloat16 units (no plan choice there: auto picks fp32) runs emulated
    # products whose rounding path is that CPU's: seed 0 never reached the level on a Zen 3
    # ([False, True, True], session 34), as the processes runtime's seeds may miss it.
    if runtime == "sequential" and (precision == "fp32" or bf16_products()):
        assert all(reached), reached
        assert sum(ended) >= 2, ended
    else:
        assert sum(reached) >= 2, reached


@pytest.mark.slow
def test_prioritized_replay_learns_cartpole():
    config = load_config(default_config_path())
    agent = pearl.DQN(config=config, replay="prioritized", total_steps=60_000)
    agent.train()
    assert agent.evaluate(10)["mean"] >= 200
