"""frost.Generator: seeding, states, independence from the global generator, and `generator=` on the random ops."""
import numpy as np
import pytest

import frost

torch = pytest.importorskip("torch")

DRAWS = {  # every op that takes generator=, as a function of it
    "rand": lambda g: frost.rand(4, 3, generator=g),
    "randn": lambda g: frost.randn(5, generator=g, dtype=frost.float64),
    "randint": lambda g: frost.randint(0, 100, (6,), generator=g),
    "randperm": lambda g: frost.randperm(9, generator=g),
    "uniform_": lambda g: frost.zeros(5).uniform_(-2, 3, generator=g),
    "normal_": lambda g: frost.zeros(5).normal_(1, 2, generator=g),
    "exponential_": lambda g: frost.zeros(5).exponential_(2.0, generator=g),
    "bernoulli_": lambda g: frost.zeros(50).bernoulli_(0.3, generator=g),
    "bernoulli": lambda g: frost.bernoulli(frost.full((50,), 0.4), generator=g),
    "multinomial": lambda g: frost.multinomial(frost.tensor([0.2, 0.3, 0.5]), 8, True, generator=g),
    "normal": lambda g: frost.normal(0.0, 1.0, (5,), generator=g),
    "cauchy_": lambda g: frost.zeros(4).cauchy_(generator=g),
    "log_normal_": lambda g: frost.zeros(4).log_normal_(generator=g),
    "geometric_": lambda g: frost.zeros(4).geometric_(0.3, generator=g),
}


def test_a_new_generator_starts_from_pytorchs_default_seed():
    g = frost.Generator()
    assert g.initial_seed() == torch.Generator().initial_seed() == 67280421310721
    assert g.device == frost.Device("cpu")


def test_manual_seed_returns_the_generator_and_sets_initial_seed():
    g = frost.Generator()
    assert g.manual_seed(7) is g and g.initial_seed() == 7
    assert g.manual_seed(-1).initial_seed() == 2**64 - 1  # unsigned 64 bits, as torch.Generator().manual_seed(-1)


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_the_same_seed_gives_the_same_draws_and_leaves_the_global_generator_alone(name):
    draw = DRAWS[name]
    frost.manual_seed(123)
    global_state = frost.get_rng_state()
    g = frost.Generator().manual_seed(42)
    first = draw(g).numpy()
    second = draw(g).numpy()
    g.manual_seed(42)
    np.testing.assert_array_equal(draw(g).numpy(), first)
    np.testing.assert_array_equal(draw(g).numpy(), second)
    assert not np.array_equal(first, second) or name == "bernoulli_"  # the stream moves on between draws
    np.testing.assert_array_equal(frost.get_rng_state().numpy(), global_state.numpy())


def test_a_generator_seeded_like_the_global_one_draws_the_same_numbers():
    frost.manual_seed(5)
    expected = frost.randn(6).numpy()
    np.testing.assert_array_equal(frost.randn(6, generator=frost.Generator().manual_seed(5)).numpy(), expected)


def test_get_state_and_set_state_replay_the_draws():
    g = frost.Generator().manual_seed(3)
    frost.rand(7, generator=g)
    state = g.get_state()
    assert state.dtype == frost.uint8 and state.shape == (40,)
    after = frost.rand(5, generator=g).numpy()
    assert g.set_state(state) is g
    np.testing.assert_array_equal(frost.rand(5, generator=g).numpy(), after)
    other = frost.Generator().set_state(state.tolist())  # a JSON list works too
    np.testing.assert_array_equal(frost.rand(5, generator=other).numpy(), after)


def test_set_state_rejects_what_get_state_did_not_make():
    g = frost.Generator()
    with pytest.raises(ValueError, match="Generator.set_state.*40 bytes, got 16"):
        g.set_state(frost.zeros(16, dtype=frost.uint8))
    with pytest.raises(ValueError, match="Generator.set_state.*increment"):
        g.set_state(frost.zeros(40, dtype=frost.uint8))


def test_seed_draws_a_fresh_seed_and_reports_it():
    g = frost.Generator()
    seeds = {g.seed() for _ in range(3)}
    assert len(seeds) == 3 and g.initial_seed() in seeds  # 64-bit entropy: a repeat has probability ~1e-19
    again = frost.Generator().manual_seed(g.initial_seed())
    np.testing.assert_array_equal(frost.rand(3, generator=g).numpy(), frost.rand(3, generator=again).numpy())


def test_bad_generators_and_seeds_are_refused_with_the_op_named():
    with pytest.raises(TypeError, match="randn: generator must be a frost.Generator, got Generator"):
        frost.randn(3, generator=np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="rand: the generator is on cpu but the result is on cuda:0"):
        frost.rand(3, device="cuda", generator=frost.Generator())
    with pytest.raises(TypeError, match="manual_seed: the seed must be an int, got float"):
        frost.Generator().manual_seed(1.5)


@pytest.mark.cuda
def test_a_cuda_generator_replays_its_draws_and_has_a_16_byte_state():
    g = frost.Generator(device="cuda").manual_seed(11)
    state = g.get_state()
    assert state.shape == (16,)
    first = frost.randn(1000, device="cuda", generator=g).numpy()
    g.set_state(state)
    np.testing.assert_array_equal(frost.randn(1000, device="cuda", generator=g).numpy(), first)
    g.manual_seed(11)
    np.testing.assert_array_equal(frost.randn(1000, device="cuda", generator=g).numpy(), first)
    assert abs(first.mean()) < 0.16  # 5 standard errors of a mean of 1000 N(0, 1) draws


@pytest.mark.cuda
def test_a_cuda_generator_refuses_cpu_results():
    with pytest.raises(RuntimeError, match="randperm: the generator is on cuda:0 but the result is on cpu"):
        frost.randperm(5, generator=frost.Generator("cuda"))
