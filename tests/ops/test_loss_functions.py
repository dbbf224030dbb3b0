"""The losses and distances of frost.ops.loss_functions (and their nn layers) against PyTorch CPU float64: values and
the gradients of every tensor argument, for each reduction."""
from functools import partial

import numpy as np
import pytest

import frost
import frost.nn.functional as F
from frost import nn
from torch_compare import check_against_torch, check_cuda_matches_cpu

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RNG = np.random.default_rng(11)
REDUCTIONS = ["mean", "sum", "none"]
_check = partial(check_against_torch, rng=RNG, rtol=1e-9)


def _probabilities(shape) -> np.ndarray:
    p = RNG.uniform(0.02, 0.98, shape)
    p.reshape(-1)[:3] = [0.0, 1.0, 0.5]  # the ends, where each log is clamped at -100
    return p


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(reduction):
    x, t = _probabilities((3, 5)), RNG.uniform(0, 1, (5, 3)).T  # a non-contiguous target
    _check(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction),
           lambda a, b: TF.binary_cross_entropy(a, b, reduction=reduction), [x, t], grads=[True, False])
    inner = [RNG.uniform(0.1, 0.9, (3, 5)), t]  # the target's gradient away from the clamped logs
    _check(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction),
           lambda a, b: TF.binary_cross_entropy(a, b, reduction=reduction), inner)


@pytest.mark.parametrize("weight_shape", [(3, 5), (5,), (1, 5)])
def test_binary_cross_entropy_weight_and_layer(weight_shape):
    x, t, w = _probabilities((3, 5)), RNG.uniform(0, 1, (3, 5)), RNG.uniform(0.5, 2, weight_shape)
    _check(lambda a, b, c: F.binary_cross_entropy(a, b, c), lambda a, b, c: TF.binary_cross_entropy(a, b, c),
           [x, t, w], grads=[True, False, False])
    # PyTorch refuses weight's gradient; frost gives it: the weighted unreduced loss is the oracle
    _check(lambda a, b, c: F.binary_cross_entropy(a, b, c),
           lambda a, b, c: (TF.binary_cross_entropy(a, b, reduction="none") * c).mean(), [x, t, w],
           grads=[True, False, True])
    layer, reference = nn.BCELoss(frost.tensor(w), reduction="sum"), torch.nn.BCELoss(torch.tensor(w),
                                                                                      reduction="sum")
    _check(layer, reference, [x, t], grads=[True, False])


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides:UserWarning")  # PyTorch's note on 'mean'
@pytest.mark.parametrize("reduction", ["mean", "batchmean", "sum", "none"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction, log_target):
    x = np.log(RNG.dirichlet(np.ones(6), 4))
    t = RNG.dirichlet(np.ones(6), 4)
    t = np.log(t) if log_target else t
    _check(lambda a, b: F.kl_div(a, b, reduction=reduction, log_target=log_target),
           lambda a, b: TF.kl_div(a, b, reduction=reduction, log_target=log_target), [x.T.copy().T, t])
    layer = nn.KLDivLoss(reduction=reduction, log_target=log_target)
    _check(layer, torch.nn.KLDivLoss(reduction=reduction, log_target=log_target), [x, t])


def test_binary_cross_entropy_target_gradient_stays_finite_at_the_ends():
    # the gradient of the loss as computed (logs clamped at -100): PyTorch's is -logit(x), infinite there
    x, t = frost.tensor([0.0, 1.0]), frost.tensor([0.3, 0.6], requires_grad=True)
    F.binary_cross_entropy(x, t, reduction="sum").backward()
    np.testing.assert_allclose(t.grad.numpy(), [100.0, -100.0])


def test_kl_div_zero_target_counts_nothing():
    x, t = np.log(np.full((2, 3), 1 / 3)), np.array([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    _check(lambda a, b: F.kl_div(a, b, reduction="batchmean"),
           lambda a, b: TF.kl_div(a, b, reduction="batchmean"), [x, t], grads=[True, False])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
def test_smooth_l1_loss(reduction, beta):
    x, t = RNG.standard_normal((4, 5)).T, RNG.standard_normal((5, 4))
    t[0, :2] = x[0, :2] + [beta, -beta]  # exactly at the threshold
    _check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=beta),
           lambda a, b: TF.smooth_l1_loss(a, b, reduction=reduction, beta=beta), [x, t])
    _check(nn.SmoothL1Loss(reduction=reduction, beta=beta),
           torch.nn.SmoothL1Loss(reduction=reduction, beta=beta), [x, t])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("delta", [1.0, 0.3, 2.5])
def test_huber_loss(reduction, delta):
    x, t = RNG.standard_normal((4, 5)) * 2, RNG.standard_normal((4, 5))
    t[0, :2] = x[0, :2] + [delta, -delta]
    _check(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=delta),
           lambda a, b: TF.huber_loss(a, b, reduction=reduction, delta=delta), [x, t])
    _check(nn.HuberLoss(reduction=reduction, delta=delta), torch.nn.HuberLoss(reduction=reduction, delta=delta),
           [x, t])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", [0.0, 0.5])
def test_margin_ranking_loss(reduction, margin):
    x1, x2 = RNG.standard_normal(8), RNG.standard_normal(8)
    y = RNG.choice([-1.0, 1.0], 8)
    _check(lambda a, b, c: F.margin_ranking_loss(a, b, c, margin=margin, reduction=reduction),
           lambda a, b, c: TF.margin_ranking_loss(a, b, c, margin=margin, reduction=reduction), [x1, x2, y])
    _check(nn.MarginRankingLoss(margin=margin, reduction=reduction),
           torch.nn.MarginRankingLoss(margin=margin, reduction=reduction), [x1, x2, y])


@pytest.mark.parametrize("dim", [1, 0, -1])
def test_cosine_similarity(dim):
    x1, x2 = RNG.standard_normal((4, 3, 5)).transpose(1, 0, 2), RNG.standard_normal((3, 4, 5))
    _check(lambda a, b: F.cosine_similarity(a, b, dim), lambda a, b: TF.cosine_similarity(a, b, dim), [x1, x2])
    _check(nn.CosineSimilarity(dim), torch.nn.CosineSimilarity(dim), [x1, x2[:1]])  # broadcasting


def test_cosine_similarity_of_tiny_vectors_clamps_the_norms():
    x1, x2 = np.array([[1e-10, 0.0], [3.0, 4.0]]), np.array([[1.0, 2.0], [0.0, 0.0]])
    _check(lambda a, b: F.cosine_similarity(a, b), lambda a, b: TF.cosine_similarity(a, b), [x1, x2])


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, 0), (3.0, -1), (float("inf"), 1)])
def test_normalize(p, dim):
    x = RNG.standard_normal((3, 4)).T
    x[:, 0] = 0.0  # a zero column: the norm is clamped to eps
    _check(lambda a: F.normalize(a, p, dim), lambda a: TF.normalize(a, p, dim), [x])


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0])
@pytest.mark.parametrize("keepdim", [False, True])
def test_pairwise_distance(p, keepdim):
    x1, x2 = RNG.standard_normal((4, 6)), RNG.standard_normal((4, 6))
    x2[0] = x1[0]  # equal rows: eps keeps the gradient finite
    _check(lambda a, b: F.pairwise_distance(a, b, p, keepdim=keepdim),
           lambda a, b: TF.pairwise_distance(a, b, p, keepdim=keepdim), [x1, x2])
    _check(nn.PairwiseDistance(p, keepdim=keepdim), torch.nn.PairwiseDistance(p, keepdim=keepdim), [x1, x2[:1]])


def test_bad_inputs_name_the_op_and_shapes():
    with pytest.raises(RuntimeError, match=r"binary_cross_entropy: all elements of input should be between 0 and 1"):
        F.binary_cross_entropy(frost.tensor([0.5, 1.5]), frost.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"binary_cross_entropy: target size \(3,\) must be the same as input "
                                         r"size \(2,\)"):
        F.binary_cross_entropy(frost.tensor([0.5, 0.5]), frost.zeros(3))
    with pytest.raises(RuntimeError, match=r"binary_cross_entropy: weight of shape \(3,\) cannot be broadcast"):
        F.binary_cross_entropy(frost.full((2, 2), 0.5), frost.zeros(2, 2), frost.ones(3))
    with pytest.raises(ValueError, match="kl_div: reduction must be one of"):
        F.kl_div(frost.zeros(2), frost.zeros(2), reduction="avg")
    with pytest.raises(ValueError, match="KLDivLoss: reduction must be one of"):
        nn.KLDivLoss(reduction="avg")
    with pytest.raises(ValueError, match="smooth_l1_loss: beta must be non-negative"):
        F.smooth_l1_loss(frost.zeros(2), frost.zeros(2), beta=-1.0)
    with pytest.raises(ValueError, match="huber_loss: delta must be positive"):
        F.huber_loss(frost.zeros(2), frost.zeros(2), delta=0.0)
    with pytest.raises(RuntimeError, match=r"huber_loss: input of shape \(2,\) and target of shape \(3,\)"):
        F.huber_loss(frost.zeros(2), frost.zeros(3))
    with pytest.raises(RuntimeError, match=r"cosine_similarity: x1 of shape \(2, 3\) and x2 of shape \(2, 4\)"):
        F.cosine_similarity(frost.zeros(2, 3), frost.zeros(2, 4))
    with pytest.raises(RuntimeError, match=r"margin_ranking_loss: input1 of shape \(2,\), input2 of shape \(3,\)"):
        F.margin_ranking_loss(frost.zeros(2), frost.zeros(3), frost.ones(2))
    with pytest.raises(IndexError, match="normalize: dim 2 is out of range"):
        F.normalize(frost.zeros(2, 3), dim=2)


@pytest.mark.cuda
def test_losses_on_cuda_match_cpu():
    x, t = RNG.uniform(0.05, 0.95, (3, 5)), RNG.uniform(0, 1, (3, 5))
    cases = [(F.binary_cross_entropy, [x, t]), (lambda a, b: F.kl_div(a.log(), b, reduction="batchmean"), [x, t]),
             (F.smooth_l1_loss, [x, t]), (F.huber_loss, [x, t]), (F.cosine_similarity, [x, t]),
             (F.normalize, [x]), (F.pairwise_distance, [x, t])]
    check_cuda_matches_cpu([(fn, [a[:, :3] for a in arrays]) for fn, arrays in cases])
