"""Image observations (issue 16): spaces accepted and refused, uint8 frames through the shared-memory
ring, the CNN Q-network's shapes, the conv cost against a hand count, image workloads on the torch
learner, and short MinAtar and Atari trainings end to end (sequential and processes runtimes)."""
from __future__ import annotations

import functools
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch

import pearl
from pearl.algos.dqn import DQN
from pearl.config import DQNConfig
from pearl.estimator.signatures import conv_forward_cost, conv_parameter_count
from pearl.nets import CNNQNetwork, ConvEncoder, TorchPolicy, conv_shapes
from pearl.plan import Plan
from pearl.runtime.shared import ActorChannel

NATURE = [[32, 8, 4], [64, 4, 2], [64, 3, 1]]
MINATAR = dict(conv=[[16, 3, 1]], hidden=[32], batch_size=8, learning_starts=64, capacity=500,
               target_update_interval=50, updates_per_step=0.25)


class SpaceEnv(gym.Env):
    """An env with the given observation space (refused or accepted by the builder)."""

    def __init__(self, space):
        self.observation_space, self.action_space = space, gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize("space", [
    gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (3,))}),
    gym.spaces.Tuple((gym.spaces.Box(0, 1, (3,)), gym.spaces.Discrete(2))),
    gym.spaces.Discrete(5),
    gym.spaces.Box(0, 255, (2, 3, 8, 8), np.uint8),
], ids=["dict", "tuple", "discrete", "4-axes"])
def test_unsupported_observation_spaces_are_refused_in_one_line(space):
    with pytest.raises(pearl.ConfigError, match=r"^env: .* has observations .*; DQN needs a flat Box or an image "
                                                r"Box \(C, H, W\)$"):
        pearl.DQN(env=functools.partial(SpaceEnv, space))


def test_actor_critics_refuse_the_frame_table_in_one_line():
    from pearl.config import parse_config

    env_id = pearl.envs.register_source(DotEnv)
    with pytest.raises(pearl.ConfigError, match=r"^replay.frame_stack: the frame table feeds DQN; td3 stores"):
        pearl.make_agent(parse_config({"algo": "td3", "env": env_id, "td3": {"conv": [[4, 3, 1]]},
                                       "replay": {"frame_stack": 4}}))


def test_images_keep_their_dtype_and_go_channels_first():
    """An (H, W, C) uint8 image env: stored (C, H, W) uint8, scaled by 1/255 at the network."""
    agent = pearl.DQN(env=functools.partial(SpaceEnv, gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)),
                      conv=[[8, 4, 2], [8, 3, 1]], hidden=[16], capacity=100, batch_size=4, learning_starts=8)
    family = agent.parts.family
    assert family.obs_field == (np.dtype(np.uint8), (3, 16, 16)) and family.obs_scale == pytest.approx(1 / 255)
    agent.train(24)
    stored = agent.parts.replay.storage["obs"]
    assert stored.dtype == np.uint8 and stored.shape[1:] == (3, 16, 16)
    assert agent.parts.learner.kernel == "torch"


def test_a_conv_stack_larger_than_the_image_is_refused_in_one_line():
    with pytest.raises(pearl.ConfigError, match=r"^dqn.conv\[1\]: the kernel 8 does not fit the 3x3 image"):
        pearl.DQN(env=functools.partial(SpaceEnv, gym.spaces.Box(0, 255, (1, 8, 8), np.uint8)),
                  conv=[[4, 3, 2], [4, 8, 1]], hidden=[8])


def test_the_fused_learner_is_refused_for_images():
    with pytest.raises(pearl.ConfigError, match=r"^runtime.learner_kernel: cpu has no fused learner for dqn"):
        pearl.DQN(env="MinAtar/Breakout-v1", learner_kernel="fused", **MINATAR)


def test_uint8_frames_survive_the_shared_memory_ring_unchanged():
    fields = {"obs": (np.dtype(np.uint8), (4, 84, 84)), "actions": (np.dtype(np.int64), ()),
              "rewards": (np.dtype(np.float32), ()), "next_obs": (np.dtype(np.uint8), (4, 84, 84)),
              "discounts": (np.dtype(np.float32), ())}
    channel = ActorChannel.create(fields, capacity=5)
    rng = np.random.default_rng(0)
    try:
        for count in (3, 4, 2):  # the second and third rounds wrap around the ring's end
            sent = (rng.integers(0, 256, (count, 4, 84, 84), dtype=np.uint8), rng.integers(0, 4, count),
                    rng.random(count, dtype=np.float32), rng.integers(0, 256, (count, 4, 84, 84), dtype=np.uint8),
                    rng.random(count, dtype=np.float32))
            channel.put(sent, [], count)
            _, runs, _ = channel.take()
            received = [np.concatenate(parts) for parts in zip(*runs)]
            del runs  # views of the ring
            for value, back in zip(sent, received):
                assert back.dtype == value.dtype and np.array_equal(back, value)
            channel.release()
    finally:
        channel.close()


def test_the_cnn_q_network_has_the_nature_shapes():
    net = CNNQNetwork((4, 84, 84), 6, [512], dueling=False, conv=NATURE, obs_scale=1 / 255)
    convs = [m for m in net.encoder.convs if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (4, 32, (8, 8), (4, 4)), (32, 64, (4, 4), (2, 2)), (64, 64, (3, 3), (1, 1))]
    assert net.encoder.out_features == 64 * 7 * 7
    assert conv_shapes((4, 84, 84), NATURE) == [(4, 84, 84), (32, 20, 20), (64, 9, 9), (64, 7, 7)]
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    q = net(frames)
    assert q.shape == (5, 6) and q.dtype == torch.float32
    assert torch.allclose(net(frames.reshape(5, -1)), q)  # rows of flattened frames: the same
    # the 1/255 is the network's input scaling: unscaled, float frames in [0, 1] give the same values
    net.encoder.obs_scale = 1.0
    assert torch.allclose(net(frames.float() / 255), q, atol=1e-5)
    dueling = CNNQNetwork((84, 84), 3, [64], dueling=True, conv=NATURE)  # (H, W): one channel
    assert dueling(torch.zeros(2, 84, 84, dtype=torch.uint8)).shape == (2, 3)


def test_the_actors_torch_policy_matches_the_learners_network():
    cfg = DQNConfig(hidden=[32], conv=[[8, 3, 1]], dueling=True)
    algo = DQN(4 * 10 * 10, 3, cfg, 100, seed=1, obs_shape=(4, 10, 10))
    from pearl.algos.dqn import q_network

    policy = TorchPolicy(q_network((4, 10, 10), 3, cfg, 1.0))
    policy.load(DQN.flat_weights(algo.online))
    obs = np.random.default_rng(0).integers(0, 2, (7, 4, 10, 10), dtype=np.uint8)
    with torch.no_grad():
        expected = algo.online(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(policy.q_values(obs), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(policy.greedy(obs), expected.argmax(1))


def test_conv_cost_matches_a_hand_count_and_torchs_flop_counter():
    # by hand, the Nature stack on one 4x84x84 observation: outputs x (2 x C_in k^2 + 2 for bias, ReLU)
    conv1 = 32 * 20 * 20 * (2 * 4 * 8 * 8 + 2)     # 6,579,200
    conv2 = 64 * 9 * 9 * (2 * 32 * 4 * 4 + 2)      # 5,318,784
    conv3 = 64 * 7 * 7 * (2 * 64 * 3 * 3 + 2)      # 3,618,944
    cost = conv_forward_cost((4, 84, 84), NATURE, batch=3, input_bytes=1)
    assert cost.flops == 3 * (conv1 + conv2 + conv3) == 3 * 15_516_928
    params = 4 * 32 * 64 + 32 + 32 * 64 * 16 + 64 + 64 * 64 * 9 + 64
    encoder = ConvEncoder((4, 84, 84), NATURE, 1.0)
    assert conv_parameter_count((4, 84, 84), NATURE) == params == sum(p.numel() for p in encoder.parameters())
    activations = 4 * 84 * 84 * 1 + 4 * (32 * 20 * 20 + 64 * 9 * 9 + 64 * 7 * 7)  # uint8 input, float32 outputs
    assert cost.bytes == 3 * activations + 4 * params
    # torch counts the multiply-adds only (2 FLOPs each), not bias and ReLU
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        encoder(torch.zeros(3, 4, 84, 84))
    assert counter.get_total_flops() == cost.flops - 3 * 2 * (32 * 20 * 20 + 64 * 9 * 9 + 64 * 7 * 7)


def test_an_image_workload_is_costed_with_its_convolutions():
    from pearl.config import parse_config
    from pearl.estimator.workload import workload_from_config

    config = parse_config({"env": "MinAtar/Breakout-v1", "dqn": {"conv": [[16, 3, 1]], "hidden": [128]}})
    workload = workload_from_config(config)
    assert workload.image and workload.obs_shape == (4, 10, 10) and workload.obs_itemsize == 1
    assert workload.learner_kernels == ("torch",)
    conv = conv_forward_cost((4, 10, 10), [[16, 3, 1]], 1, input_bytes=1)
    fc = 2 * (16 * 8 * 8 * 128 + 128 * 3) + 2 * (128 + 3)
    assert workload.act_cost(1).flops == conv.flops + fc
    assert workload.n_params == conv_parameter_count((4, 10, 10), [[16, 3, 1]]) + 1024 * 128 + 128 + 128 * 3 + 3
    assert workload.transition_bytes == 2 * 400 + 3 * 4  # uint8 obs and next obs, action, reward, discount
    assert workload.insert_bytes == workload.transition_bytes  # (whole observations)


def test_the_estimator_prices_a_frame_tables_step_records_as_the_wire_carries_them():
    """With replay.frame_stack the actors write, and a replay server receives, one frame of obs and
    of next obs per env step (not two stacks): the workload's insert bytes are the server's
    insert columns' bytes, ~1/4 of the transition's for Atari's 4 x 84 x 84."""
    from pearl.estimator.workload import Workload
    from pearl.server.config import ServerConfig, TableConfig

    atari = Workload(env="ALE/Breakout-v5", obs_dim=4 * 84 * 84, n_actions=4, hidden=(512,), replay_kind="uniform",
                     capacity=100_000, fanout=16, updates_per_step=0.25, learning_starts=0, obs_shape=(4, 84, 84),
                     obs_itemsize=1, conv=((32, 8, 4),), frame_stack=4)
    columns = ServerConfig(table=TableConfig(obs_shape=(84, 84), obs_dtype="uint8", frame_stack=4)).schema()
    assert atari.insert_bytes == sum(c.dtype.itemsize * int(np.prod(c.shape)) for c in columns) == 2 * 84 * 84 + 22
    assert atari.transition_bytes == 2 * 4 * 84 * 84 + 12 and "frames4" in atari.key()


def test_minatar_trains_end_to_end_with_uint8_replay(tmp_path):
    agent = pearl.DQN(env="MinAtar/Breakout-v1", seed=3, **MINATAR)
    assert agent.parts.family.obs_field == (np.dtype(np.uint8), (4, 10, 10))
    agent.train(300)
    c = agent.counters
    assert c.env_steps == 300 and c.updates == (300 - 64) // 4 and c.episodes > 0
    stored = agent.parts.replay.storage["obs"][:len(agent.parts.replay)]
    assert stored.dtype == np.uint8 and set(np.unique(stored)) <= {0, 1}
    assert np.isfinite(agent.evaluate(2)["mean"])
    agent.save(tmp_path / "minatar.npz")  # the CNN's weights and the uint8 replay come back
    restored = pearl.load(tmp_path / "minatar.npz")
    boards = np.random.default_rng(0).integers(0, 2, (3, 4, 10, 10), dtype=np.uint8)
    np.testing.assert_array_equal(restored.parts.policy.q_values(boards), agent.parts.policy.q_values(boards))
    np.testing.assert_array_equal(restored.parts.replay.storage["obs"][:300], agent.parts.replay.storage["obs"][:300])


@pytest.mark.slow
def test_minatar_in_the_processes_runtime_with_two_actors():
    agent = pearl.DQN(env="MinAtar/Breakout-v1", seed=4, plan=Plan(runtime="processes", actors=2), **MINATAR)
    agent.train(200)
    c = agent.counters
    assert c.env_steps >= 200 and c.updates == int((c.env_steps - 64) * 0.25)
    assert len(agent.parts.replay) == c.env_steps  # every step's transition, once (n_step 1)
    assert agent.parts.replay.storage["obs"].dtype == np.uint8


def test_a_train_call_stops_the_learners_second_thread():
    """runtime.torch_threads 2 on a CNN (a split batch, pearl/runtime/learners.py): the agent
    releases the learner when a train call ends, so no thread of it is left (a processes run
    later in this process forks its actors only while no other thread is), and the next call
    starts it again."""
    agent = pearl.DQN(env="MinAtar/Breakout-v1", seed=4, torch_threads=2, plan=Plan(runtime="processes"), **MINATAR)
    threads = threading.active_count()
    for steps in (200, 300):
        running = []
        agent.train(steps, on_round=lambda a: running.append(a.parts.learner._pool is not None))
        assert any(running)  # the call's updates ran a half batch on the worker
        assert threading.active_count() == threads and agent.parts.learner._pool is None
    c = agent.counters
    assert c.env_steps >= 500 and c.updates == int((c.env_steps - 64) * 0.25)


ATARI = dict(hidden=[64], batch_size=8, learning_starts=100, capacity=1000, updates_per_step=0.25,
             target_update_interval=100)


def test_an_atari_id_gets_the_standard_preprocessing():
    from pearl.envs import ScoreKeepingClip, make_env

    env = make_env("ALE/Breakout-v5", seed=0)
    try:
        assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert isinstance(env.env, ScoreKeepingClip)  # FrameStackObservation(ScoreKeepingClip(AtariPreprocessing))
        preprocessing = env.env.env
        assert (preprocessing.noop_max, preprocessing.frame_skip, preprocessing.terminal_on_life_loss) == (30, 4, False)
        assert preprocessing.env.unwrapped._frameskip == 1  # the skipping (with max-pool) is the wrapper's
    finally:
        env.close()


@pytest.mark.slow
def test_atari_trains_end_to_end_sequential_and_with_two_actor_processes():
    agent = pearl.DQN(env="ALE/Breakout-v5", seed=0, **ATARI)
    agent.train(200)
    assert agent.counters.env_steps == 200 and agent.counters.updates == 25
    assert agent.parts.replay.storage["obs"].dtype == np.uint8
    agent = pearl.DQN(env="BreakoutNoFrameskip-v4", seed=0, plan=Plan(runtime="processes", actors=2), **ATARI)
    agent.train(200)
    c = agent.counters
    assert c.env_steps >= 200 and c.updates == int((c.env_steps - 100) * 0.25)
    assert len(agent.parts.replay) == c.env_steps


class DotEnv(gym.Env):
    """A small image env for the actor-critics: a dot on a 12x12 grey image, moved by a Box action,
    rewarded by minus its distance to the centre."""

    observation_space = gym.spaces.Box(0, 255, (1, 12, 12), np.uint8)
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = self.np_random.uniform(0, 11, 2), 0
        return self._obs(), {}

    def _obs(self):
        image = np.zeros((1, 12, 12), np.uint8)
        x, y = np.clip(self.pos.round().astype(int), 0, 11)
        image[0, y, x] = 255
        return image

    def step(self, action):
        self.pos = np.clip(self.pos + np.asarray(action), 0, 11)
        self.t += 1
        return self._obs(), -float(np.abs(self.pos - 5.5).sum()) / 11, False, self.t >= 50, {}


@pytest.mark.parametrize("agent_class", [pearl.TD3, pytest.param(pearl.SAC, marks=pytest.mark.slow)])
def test_actor_critics_learn_from_images_through_a_shared_encoder(agent_class):
    agent = agent_class(env=DotEnv, conv=[[8, 3, 2], [8, 3, 1]], hidden=[32, 32], learning_starts=40,
                        batch_size=16, capacity=300, seed=0)
    algo = agent.parts.algo
    assert agent.parts.learner.kernel == "torch" and agent.parts.replay.storage["obs"].dtype == np.uint8
    critic_params = {id(p) for group in algo.critic_optimizer.param_groups for p in group["params"]}
    actor_params = {id(p) for group in algo.actor_optimizer.param_groups for p in group["params"]}
    encoder = [id(p) for p in algo.encoder.online.parameters()]
    assert set(encoder) <= critic_params and not set(encoder) & actor_params  # the critic trains it
    before = [p.detach().clone() for p in algo.encoder.online.parameters()]
    agent.train(100)
    assert agent.counters.updates == 60
    assert any(not torch.equal(b, p) for b, p in zip(before, algo.encoder.online.parameters()))
    # the actor's copy (encoder, then the actor MLP, loaded from the flat weights) is the learner's policy
    obs = np.random.default_rng(1).integers(0, 256, (5, 1, 12, 12), dtype=np.uint8)
    with torch.no_grad():
        expected = algo.policy_network()(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(agent.parts.policy.net.q_values(obs), expected, rtol=1e-5, atol=1e-6)
    assert np.isfinite(agent.evaluate(1)["mean"])


class CountingFrames(gym.Env):
    """Stacks of 4 frames whose pixel (0, 0) is the step's index in its episode and pixel (0, 1) an
    episode tag drawn at reset; episodes of 5-12 steps end terminated or truncated. A stored
    transition can then be checked against the stream it came from."""

    observation_space = gym.spaces.Box(0, 255, (4, 6, 6), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.tag = 0, int(self.np_random.integers(1, 256))
        self.length = int(self.np_random.integers(5, 13))
        self.frames = [self._frame()] * 4  # FrameStackObservation's reset padding
        return np.stack(self.frames), {}

    def _frame(self):
        frame = np.zeros((6, 6), np.uint8)
        frame[0, 0], frame[0, 1] = self.t, self.tag
        return frame

    def step(self, action):
        self.t += 1
        self.frames = self.frames[1:] + [self._frame()]
        end = self.t >= self.length
        return np.stack(self.frames), 1.0, end and self.tag % 2 == 0, end and self.tag % 2 == 1, {}


def check_frame_transitions(agent, count=64):
    """Every sampled obs is a stack of one episode's consecutive steps (the first repeated at its
    start) and next obs the stack one step later, as the env made them."""
    replay = agent.parts.replay
    limiter, replay.rate_limiter = replay.rate_limiter, None  # the run is over: this extra batch is the test's
    batch = replay.sample(count, np.random.default_rng(0))
    replay.rate_limiter = limiter
    check_frame_batch(batch)


def check_frame_batch(batch):
    for obs, next_obs, discount in zip(batch.obs, batch.next_obs, batch.discounts):
        steps, tags = obs[:, 0, 0].astype(int), obs[:, 0, 1]
        assert len(set(tags)) == 1 and set(next_obs[:, 0, 1]) == set(tags)
        newest = steps[-1]
        assert list(steps) == [max(0, newest - k) for k in (3, 2, 1, 0)]
        assert list(next_obs[:, 0, 0].astype(int)) == [max(0, newest + 1 - k) for k in (3, 2, 1, 0)]
        # only an even-tagged episode terminates (odd ones are truncated: bootstrapped)
        assert discount == pytest.approx(0.99) or (discount == 0.0 and tags[0] % 2 == 0)


def frame_agent(plan=None, total_steps=400):
    from pearl.config import parse_config

    env_id = pearl.envs.register_source(CountingFrames)
    config = parse_config({"env": env_id, "total_steps": total_steps,
                           "dqn": {"conv": [[4, 3, 1]], "hidden": [8], "batch_size": 8, "learning_starts": 50,
                                   "updates_per_step": 0.25},
                           "replay": {"capacity": 1000, "frame_stack": 4}})
    return pearl.make_agent(config, plan)


def test_actors_feed_the_frame_table_step_records():
    from pearl.replay import FrameReplay

    agent = frame_agent()
    assert isinstance(agent.parts.replay, FrameReplay)
    agent.train(300)
    assert agent.parts.replay.inserted == 300 and agent.counters.updates == (300 - 50) // 4
    check_frame_transitions(agent)


def test_a_saved_frame_table_holds_its_stored_records_and_trains_on(tmp_path):
    """An agent's checkpoint with a frame table far from full holds the records written, not the
    table's capacity (pearl.load reads it back through pearl/checkpoint.py's shape checks), and the
    loaded agent holds the same transitions and trains on."""
    agent = frame_agent()
    agent.train(120)
    agent.save(tmp_path / "agent")
    arrays = np.load(tmp_path / "agent.npz")
    records = int(agent.parts.replay._counts.sum())  # a record per env step, and per episode its first frame
    assert 120 < arrays["replay.frames"].shape[0] == records < agent.parts.replay.capacity // 2
    loaded = pearl.load(tmp_path / "agent.npz")
    table, again = agent.parts.replay, loaded.parts.replay
    valid = np.flatnonzero(table._valid)
    assert valid.size > 64 and np.array_equal(np.flatnonzero(again._valid), valid)
    a, b = table.gather(valid), again.gather(valid)
    for name in ("obs", "next_obs", "actions", "rewards", "discounts"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    loaded.train(200)
    assert again.inserted == loaded.env_steps == 320  # (train(n): n more steps)
    check_frame_transitions(loaded)


def test_a_runs_checkpoint_of_a_frame_table_is_written_while_it_trains_on(tmp_path, monkeypatch):
    """A run's periodic checkpoint (`checkpoint(background=True)`) of a frame table: the file
    holds the agent of the moment it was asked for, array for array what `save` wrote then,
    although the run trained on (adds overwriting the full ring, updates changing the weights and
    the optimizer's state) before the writing thread wrote a byte; a checkpoint asked for meanwhile
    waits for it. It resumes like any checkpoint."""
    import threading

    from pearl import checkpoint
    from pearl.checkpoint import load_checkpoint
    from pearl.replay import frames

    agent = frame_agent(total_steps=1500)
    monkeypatch.setattr(frames, "SNAPSHOT_BLOCK_BYTES", 64 * agent.parts.replay._frames.shape[1])
    agent.train(1100)  # the ring (1,000 records) wrapped
    agent.save(tmp_path / "then")
    gate, run = threading.Event(), checkpoint.CheckpointThread.run
    monkeypatch.setattr(checkpoint.CheckpointThread, "run", lambda thread: (gate.wait(30), run(thread)))
    assert agent.checkpoint(tmp_path / "checkpoint.npz", background=True)
    agent.train(300)
    assert not (tmp_path / "checkpoint.npz").exists() and agent.parts.replay._snapshots
    gate.set()
    agent.finish_checkpoint()
    assert agent.parts.replay._snapshots == []
    header, arrays = load_checkpoint(tmp_path / "checkpoint.npz")
    then_header, then_arrays = load_checkpoint(tmp_path / "then.npz")
    assert header == then_header and arrays.keys() == then_arrays.keys()
    for name, values in then_arrays.items():
        assert np.array_equal(arrays[name], values), name
    assert not np.array_equal(agent.parts.replay.frames, arrays["replay.frames"].reshape(agent.parts.replay.frames.shape))
    resumed = pearl.load(tmp_path / "checkpoint.npz")
    assert resumed.env_steps == 1100
    resumed.train(100)
    check_frame_transitions(resumed)


def test_a_checkpoint_that_fails_in_the_background_stops_the_run_at_the_next_one(tmp_path, monkeypatch):
    """A periodic checkpoint whose thread fails (here: the disk fills while frames are written)
    stops the run with one line naming the file when the next checkpoint is due; the checkpoint
    before it stays, and the table's adds stopped copying for the failed one."""
    import errno

    from pearl.errors import PearlError
    from pearl.replay import frames

    agent = frame_agent(total_steps=600)
    agent.config.log.checkpoint_interval = 200
    block, calls = frames.FrameSnapshot.block, []

    def filling_up(snapshot, index):
        calls.append(index)
        if agent.env_steps >= 400:
            raise OSError(errno.ENOSPC, "No space left on device")
        return block(snapshot, index)

    monkeypatch.setattr(frames.FrameSnapshot, "block", filling_up)
    with pytest.raises(PearlError, match=r"checkpoint\.npz: could not be written \(No space left on device\); "
                                         r"the previous file is kept$"):
        agent.train(run_dir=tmp_path)
    assert calls and agent.parts.replay._snapshots == [] and agent.env_steps == 600
    assert pearl.load(tmp_path).env_steps == 200


@pytest.mark.slow
def test_two_actor_processes_feed_the_frame_table_as_separate_streams():
    """The learner's own actor writes actor 0's streams while the actor processes start; a second
    run's actor processes and its own actor take those streams over again mid-episode."""
    agent = frame_agent(Plan(runtime="processes", actors=2))
    agent.train(300)
    assert agent.parts.replay.inserted == agent.counters.env_steps >= 300
    check_frame_transitions(agent)
    agent.train(100)
    assert agent.parts.replay.inserted == agent.counters.env_steps >= 400
    check_frame_transitions(agent, count=256)


@pytest.mark.parametrize("runtime, actors", [("sequential", 1), ("processes", 2)])
def test_a_frame_table_on_a_replay_server_takes_the_actors_step_records(runtime, actors):
    """`plan.devices.sample: server:ADDR` with a frame table: the actors' step records go to a
    `pearl replay-server` frame table (one stream per env), every env step's record stored once;
    the learner's batches are stacks of one episode's consecutive frames. A server of fewer
    streams, another n_step, or whole observations is refused in one line."""
    pytest.importorskip("zmq")
    from pearl.plan import ServerAccess
    from pearl.server.config import ServerConfig, TableConfig
    from pearl.server.server import ReplayServer

    def serve(**table):
        keys = dict(capacity=1000, obs_shape=(6, 6), obs_dtype="uint8", frame_stack=4, streams=2 * actors)
        return ReplayServer(ServerConfig(table=TableConfig(**{**keys, **table}), bind="tcp://127.0.0.1:0")).start()

    def on(server):
        return Plan(runtime=runtime, actors=actors, envs_per_actor=2,
                    devices={task: f"server:{server.address}" for task in ("insert", "sample", "update_priorities")},
                    server=ServerAccess(plaintext=True))

    server = serve()
    try:
        agent = frame_agent(on(server))
        agent.train(300)
        agent.parts.replay.flush()  # (the last chunks' acknowledgements)
        table = server.service.table
        assert table.inserted == agent.env_steps >= 300 and agent.updates == (agent.env_steps - 50) // 4
        assert (table._counts > 0).all()  # every env's stream
        check_frame_batch(agent.parts.replay.sample(64))
        agent.parts.replay.close()
    finally:
        server.stop()
    for table, says in ((dict(streams=1), f"has 1 env streams; this run's actors step {2 * actors}"),
                        (dict(n_step=3), "'n_step': 3"),
                        (dict(obs_shape=(4, 6, 6), frame_stack=0, streams=1), "holds")):
        server = serve(**table)
        try:
            with pytest.raises(pearl.ConfigError, match=r"^plan\.devices\.sample: the replay server at .*" + says):
                frame_agent(on(server))
        finally:
            server.stop()


def test_a_ray_frame_table_of_more_shards_than_streams_is_refused_in_one_line():
    from pearl.plan import RayPlan

    plan = Plan(runtime="ray", actors=1, envs_per_actor=1, ray=RayPlan(nodes=2, replay="server", shards=3))
    with pytest.raises(pearl.ConfigError, match=r"^plan\.ray\.shards: 3 shards for a frame table of 2 env streams"):
        frame_agent(plan)
