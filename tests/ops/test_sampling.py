"""Random sampling (frost.ops.sampling): the draws' statistics with fixed seeds, PyTorch's errors, in-place rules.

Statistical checks use fixed seeds, so they are deterministic; their thresholds are set so that a correct sampler
with a random seed would fail them rarely: moments within 5 standard errors (probability ~6e-7), chi-square
p-values above 1e-6. Each statistic is also shown to reject a wrong distribution, so that the checks can fail.
"""
import math

import numpy as np
import pytest

import frost

torch = pytest.importorskip("torch")


def _generator(seed: int = 0) -> frost.Generator:
    return frost.Generator().manual_seed(seed)


def _chi_square_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """P(chi-square >= statistic) for an even number of degrees of freedom (categories - 1), in closed form:
    exp(-x/2) * sum_{i < dof/2} (x/2)^i / i!."""
    dof = len(counts) - 1
    assert dof % 2 == 0, "use an odd number of categories"
    expected = counts.sum() * probs
    half = float(((counts - expected) ** 2 / expected).sum()) / 2
    return math.exp(-half) * sum(half ** i / math.factorial(i) for i in range(dof // 2))


def _within_standard_errors(samples: np.ndarray, mean: float, std: float, sigmas: float = 5.0) -> bool:
    return abs(samples.mean() - mean) < sigmas * std / math.sqrt(samples.size)


# ---------------------------------------------------------------- multinomial
WEIGHTS = np.array([0.5, 0.0, 2.0, 1.0, 1.5, 0.7])  # unnormalized, one zero


def test_multinomial_with_replacement_draws_each_category_with_its_probability():
    probs = WEIGHTS / WEIGHTS.sum()
    draws = frost.multinomial(frost.tensor(WEIGHTS), 40000, replacement=True, generator=_generator(1)).numpy()
    assert draws.shape == (40000,) and draws.dtype == np.int64
    counts = np.bincount(draws, minlength=6)
    assert counts[1] == 0  # a zero-probability category never comes up
    nonzero = probs > 0
    assert _chi_square_p_value(counts[nonzero], probs[nonzero] / probs[nonzero].sum()) > 1e-6
    wrong = np.array([0.1, 0.4, 0.2, 0.2, 0.1])  # the same counts reject another distribution
    assert _chi_square_p_value(counts[nonzero], wrong) < 1e-6


def test_multinomial_draws_every_row_from_its_own_distribution():
    rows = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 1.0, 1.0], [0.2, 0.3, 0.5]])
    draws = frost.multinomial(frost.tensor(rows), 30000, True, generator=_generator(2)).numpy()
    assert draws.shape == (4, 30000)
    assert (draws[0] == 0).all() and (draws[1] == 2).all() and set(np.unique(draws[2])) == {1, 2}
    assert _chi_square_p_value(np.bincount(draws[3], minlength=3), rows[3]) > 1e-6
    assert _within_standard_errors((draws[2] == 1).astype(float), 0.5, 0.5)


def test_multinomial_without_replacement_draws_distinct_categories_and_the_first_with_its_probability():
    probs = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    rows = np.tile(probs, (20000, 1))
    draws = frost.multinomial(frost.tensor(rows), 3, generator=_generator(3)).numpy()
    assert draws.shape == (20000, 3)
    assert (np.sort(draws, axis=1)[:, 1:] != np.sort(draws, axis=1)[:, :-1]).all()
    assert _chi_square_p_value(np.bincount(draws[:, 0], minlength=5), probs) > 1e-6
    # the second draw is the first of what is left: P(second = j) = sum_i p_i p_j / (1 - p_i)
    second = np.array([sum(probs[i] * probs[j] / (1 - probs[i]) for i in range(5) if i != j) for j in range(5)])
    assert _chi_square_p_value(np.bincount(draws[:, 1], minlength=5), second) > 1e-6


def test_multinomial_without_replacement_of_every_category_is_a_permutation_positive_first():
    draws = frost.multinomial(frost.tensor([[0.0, 1.0, 2.0, 0.0, 3.0]] * 50), 5, generator=_generator(4)).numpy()
    assert (np.sort(draws, axis=1) == np.arange(5)).all()
    assert set(draws[:, :3].reshape(-1)) == {1, 2, 4}  # zero-probability categories only after the others


def test_multinomial_draws_no_gradient_and_accepts_float32():
    probs = frost.tensor([0.3, 0.7], requires_grad=True)
    draws = probs.multinomial(4, replacement=True, generator=_generator())
    assert not draws.requires_grad and draws.dtype == frost.int64 and set(draws.tolist()) <= {0, 1}


NAN_INF_OR_NEGATIVE = "probability tensor contains either `inf`, `nan` or element < 0"


@pytest.mark.parametrize("probs, n, replacement, message, torch_message", [
    ([1.0, -1.0], 1, False, NAN_INF_OR_NEGATIVE, NAN_INF_OR_NEGATIVE),
    ([1.0, float("nan")], 1, True, NAN_INF_OR_NEGATIVE, NAN_INF_OR_NEGATIVE),
    ([1.0, float("inf")], 2, True, NAN_INF_OR_NEGATIVE, "encountering probability entry = infinity or NaN"),
    ([[0.0, 0.0], [1.0, 1.0]], 2, True, r"invalid multinomial distribution \(sum of probabilities <= 0\)", None),
    ([1.0, 1.0], 3, False, r"cannot sample n_sample > prob_dist.size\(-1\) samples without replacement", None),
    ([1.0, 1.0], 0, True, "cannot sample n_sample <= 0 samples", None),
    ([[[1.0]]], 1, True, r"prob_dist must be 1 or 2 dim, got shape \(1, 1, 1\)", "prob_dist must be 1 or 2 dim"),
])
def test_multinomial_refuses_what_pytorch_refuses(probs, n, replacement, message, torch_message):
    with pytest.raises(RuntimeError, match="multinomial: " + message):
        frost.multinomial(frost.tensor(probs), n, replacement)
    with pytest.raises(RuntimeError, match=torch_message or message):
        torch.multinomial(torch.tensor(probs), n, replacement)


def test_multinomial_refuses_integer_probabilities():
    with pytest.raises(RuntimeError, match="multinomial: only supports floating-point dtypes for input, got "
                                           "frost.int64"):
        frost.multinomial(frost.tensor([1, 2]), 1)


# ---------------------------------------------------------------- bernoulli
def test_bernoulli_draws_ones_with_each_elements_probability():
    p = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    probs = frost.tensor(np.tile(p, (20000, 1)), dtype=frost.float64)
    draws = frost.bernoulli(probs, generator=_generator(5))
    assert draws.dtype == frost.float64 and draws.shape == probs.shape
    values = draws.numpy()
    assert set(np.unique(values)) == {0.0, 1.0}
    assert (values[:, 0] == 0).all() and (values[:, 4] == 1).all()
    for j in (1, 2, 3):
        assert _within_standard_errors(values[:, j], p[j], math.sqrt(p[j] * (1 - p[j])))
    assert not _within_standard_errors(values[:, 1], 0.12, math.sqrt(0.1 * 0.9))


def test_bernoulli_with_a_scalar_p_and_the_in_place_forms():
    shape = (100000,)
    assert _within_standard_errors(frost.bernoulli(frost.zeros(shape), 0.25, generator=_generator(6)).numpy(),
                                   0.25, math.sqrt(0.25 * 0.75))
    filled = frost.zeros(shape, dtype=frost.int64).bernoulli_(0.75, generator=_generator(7))
    assert filled.dtype == frost.int64
    assert _within_standard_errors(filled.numpy(), 0.75, math.sqrt(0.25 * 0.75))
    per_element = frost.zeros(2, 50000).bernoulli_(frost.tensor([[0.0], [1.0]]), generator=_generator(8)).numpy()
    assert (per_element[0] == 0).all() and (per_element[1] == 1).all()


def test_bernoulli_refuses_probabilities_outside_0_1():
    with pytest.raises(RuntimeError, match="bernoulli: expects every probability in \\[0, 1\\]"):
        frost.bernoulli(frost.tensor([0.5, 1.5]))
    with pytest.raises(RuntimeError, match="bernoulli_: expects p to be in \\[0, 1\\], but got p=2"):
        frost.zeros(2).bernoulli_(2)
    with pytest.raises(RuntimeError, match="bernoulli: the probabilities must be floating point, got frost.int64"):
        frost.bernoulli(frost.tensor([0, 1]))


# ---------------------------------------------------------------- normal and the in-place distributions
def test_normal_of_tensors_broadcasts_mean_and_std():
    mean = frost.tensor([[-3.0], [0.0], [10.0]], dtype=frost.float64)
    std = frost.tensor([0.5, 2.0] * 20000, dtype=frost.float64)
    draws = frost.normal(mean, std, generator=_generator(9))
    assert draws.shape == (3, 40000) and draws.dtype == frost.float64 and not draws.requires_grad
    values = draws.numpy()
    for row, m in enumerate((-3.0, 0.0, 10.0)):
        for col, s in ((0, 0.5), (1, 2.0)):
            part = values[row, col::2]
            assert _within_standard_errors(part, m, s)
            assert abs(part.std() - s) < 5 * s / math.sqrt(2 * part.size)  # the standard error of a sample std


def test_normal_of_numbers_needs_a_size_and_takes_dtype():
    draws = frost.normal(1.0, 3.0, (50000,), generator=_generator(10), dtype=frost.float64)
    assert draws.dtype == frost.float64 and _within_standard_errors(draws.numpy(), 1.0, 3.0)
    assert frost.normal(frost.zeros(3), 1.0).shape == (3,) and frost.normal(0.0, frost.ones(2, 2)).shape == (2, 2)
    with pytest.raises(RuntimeError, match="normal: with a float mean and std, give the shape as size="):
        frost.normal(0.0, 1.0)
    with pytest.raises(RuntimeError, match="normal: expects all elements of std >= 0.0"):
        frost.normal(frost.zeros(2), frost.tensor([1.0, -1.0]))


def test_exponential_draws_have_mean_and_std_one_over_lambda():
    draws = frost.zeros(100000, dtype=frost.float64).exponential_(4.0, generator=_generator(11)).numpy()
    assert draws.min() >= 0 and _within_standard_errors(draws, 0.25, 0.25)
    assert abs(np.median(draws) - math.log(2) / 4) < 0.005  # 5 standard errors of the median (~1/(2 f sqrt n))
    with pytest.raises(RuntimeError, match="exponential_: expects lambda > 0.0, but found lambda=-1"):
        frost.zeros(2).exponential_(-1)
    with pytest.raises(RuntimeError, match="exponential_: draws floating-point numbers, got a tensor of frost.int64"):
        frost.zeros(2, dtype=frost.int64).exponential_()


def test_cauchy_log_normal_and_geometric_draws():
    n = 100000
    cauchy = frost.zeros(n, dtype=frost.float64).cauchy_(2.0, 0.5, generator=_generator(12)).numpy()
    assert abs(np.median(cauchy) - 2.0) < 5 * math.pi * 0.5 / (2 * math.sqrt(n))  # the median's standard error
    assert abs(np.percentile(cauchy, 75) - 2.5) < 0.02  # quartiles at median +- sigma
    log_normal = frost.zeros(n, dtype=frost.float64).log_normal_(1.0, 0.5, generator=_generator(13)).numpy()
    assert _within_standard_errors(np.log(log_normal), 1.0, 0.5)
    geometric = frost.zeros(n).geometric_(0.25, generator=_generator(14)).numpy()
    assert geometric.min() == 1 and _within_standard_errors(geometric, 4.0, math.sqrt(0.75) / 0.25)


def test_in_place_draws_into_a_leaf_that_requires_grad_are_refused():
    weight = frost.zeros(3, requires_grad=True)
    for draw in (lambda: weight.exponential_(), lambda: weight.bernoulli_(0.5), lambda: weight.uniform_()):
        with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
            draw()
    with frost.no_grad():
        weight.exponential_(generator=_generator())
    assert (weight.detach().numpy() > 0).all()


# ---------------------------------------------------------------- CUDA
@pytest.mark.cuda
def test_multinomial_on_cuda_draws_distinct_categories_and_follows_the_probabilities():
    g = frost.Generator("cuda").manual_seed(0)
    rows = frost.tensor([[0.1, 0.2, 0.3, 0.15, 0.25]] * 20000, device="cuda")
    draws = frost.multinomial(rows, 3, generator=g).numpy()
    assert (np.sort(draws, axis=1)[:, 1:] != np.sort(draws, axis=1)[:, :-1]).all()
    probs = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    assert _chi_square_p_value(np.bincount(draws[:, 0], minlength=5), probs) > 1e-6
    with_replacement = frost.multinomial(rows[0], 50000, True, generator=g).numpy()
    assert _chi_square_p_value(np.bincount(with_replacement, minlength=5), probs) > 1e-6


@pytest.mark.cuda
def test_bernoulli_normal_and_exponential_on_cuda():
    g = frost.Generator("cuda").manual_seed(1)
    ones = frost.bernoulli(frost.full((100000,), 0.3, device="cuda"), generator=g).numpy()
    assert _within_standard_errors(ones, 0.3, math.sqrt(0.21))
    normal = frost.normal(frost.full((100000,), 2.0, device="cuda"), 3.0, generator=g).numpy()
    assert _within_standard_errors(normal, 2.0, 3.0)
    exponential = frost.zeros(100000, device="cuda").exponential_(2.0, generator=g).numpy()
    assert _within_standard_errors(exponential, 0.5, 0.5)
