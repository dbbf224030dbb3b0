"""In anomaly mode an optimizer's step() names the parameter whose gradient holds NaN or inf (named_parameters)."""
import numpy as np
import pytest

import frost
import frost.nn.functional as F
from frost.autograd import AnomalyError, detect_anomaly
from frost.optim import SGD, Adam, AdamW, Optimizer, SophiaG

# every optimizer frost.optim exports, each with its default options (SGD with momentum, to have state)
OPTIMIZERS = [(cls, dict(momentum=0.9) if cls is SGD else {}) for cls in
              sorted({getattr(frost.optim, name) for name in frost.optim.__all__}
                     - {Optimizer, frost.optim.schedule, frost.optim.lr_scheduler}, key=lambda c: c.__name__)
              if isinstance(cls, type) and issubclass(cls, Optimizer)]
IDS = [cls.__name__ for cls, _ in OPTIMIZERS]


class Net(frost.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = frost.nn.Linear(4, 3)
        self.out = frost.nn.Linear(3, 2)

    def forward(self, x):
        return self.out(F.relu(self.fc(x)))


def model_with_gradients():
    frost.manual_seed(0)
    model = Net()
    F.cross_entropy(model(frost.randn(8, 4)), frost.tensor(np.arange(8) % 2)).backward()
    return model


@pytest.mark.parametrize("cls, options", OPTIMIZERS, ids=IDS)
def test_nan_gradient_is_reported_with_the_parameters_name(cls, options):
    assert len(OPTIMIZERS) >= 5
    model = model_with_gradients()
    opt = cls(model.named_parameters(), **options)
    model.fc.weight.grad.data[1, 2] = np.nan
    before = [p.detach().numpy().copy() for p in model.parameters()]
    with detect_anomaly():
        with pytest.raises(AnomalyError, match=r"anomaly: gradient of parameter 'fc\.weight' \(shape \(3, 4\), "
                                               r"float32\) contains NaN or inf at " + cls.__name__):
            opt.step()
    for p, b in zip(model.parameters(), before):  # the check comes before any update
        np.testing.assert_array_equal(p.detach().numpy(), b)
    opt.step()  # outside anomaly mode nothing is checked: the NaN goes through
    assert np.isnan(model.fc.weight.detach().numpy()).any()


def test_inf_in_a_bias_and_unnamed_parameters_are_named_by_group_and_index():
    model = model_with_gradients()
    model.out.bias.grad.data[0] = np.inf
    opt = Adam([{"params": [model.fc.weight, model.fc.bias]}, {"params": [model.out.weight, model.out.bias]}])
    with detect_anomaly(), pytest.raises(AnomalyError, match=r"gradient of parameter 'param 1\.1' \(shape \(2,\)"):
        opt.step()
    named = AdamW([{"params": [("head.bias", model.out.bias)], "lr": 0.5}])  # names inside groups, too
    with detect_anomaly(), pytest.raises(AnomalyError, match="'head.bias'"):
        named.step()


def test_sophia_update_hessian_checks_the_sampled_label_gradients():
    model = model_with_gradients()
    opt = SophiaG(model.named_parameters())
    model.out.weight.grad.data[...] = np.nan
    with detect_anomaly(), pytest.raises(AnomalyError, match=r"'out\.weight' .* at SophiaG\.update_hessian\(\)"):
        opt.update_hessian()


def test_named_parameters_train_exactly_like_plain_parameters():
    steps = []
    for named in (False, True):
        model = model_with_gradients()
        opt = AdamW(model.named_parameters() if named else model.parameters(), lr=0.1)
        with detect_anomaly():
            opt.step()
        steps.append([p.detach().numpy() for p in model.parameters()] + [opt.state_dict()["param_groups"][0]["params"]])
    for a, b in zip(*steps):
        np.testing.assert_array_equal(a, b)
