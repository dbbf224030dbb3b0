"""ZeroRedundancyOptimizer in one process (a world of 1 stands in); its training on 2 and 3 processes is compared
with one process in test_data_parallel.py."""
import numpy as np

import frost
from frost import nn
from frost.distributed.optim import ZeroRedundancyOptimizer


def test_param_groups_stay_the_wrapped_optimizers_after_load_state_dict(alike_world):
    """A learning-rate schedule sets zero.param_groups[i]["lr"]: after resuming it must still reach step()."""
    frost.manual_seed(0)
    model = nn.Linear(3, 1)
    zero = ZeroRedundancyOptimizer(model.parameters(), frost.optim.SGD, lr=0.1)
    model(frost.ones(1, 3)).sum().backward()
    zero.step()
    zero.load_state_dict(zero.state_dict())
    for group in zero.param_groups:
        group["lr"] = 0.0
    before = [p.detach().numpy().copy() for p in model.parameters()]
    zero.zero_grad()
    model(frost.ones(1, 3)).sum().backward()
    zero.step()
    for b, p in zip(before, model.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), b)
