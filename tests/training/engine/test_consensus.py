import torch

from training.engine.consensus import StepConsensus
from training.engine.distributed import DistContext

SINGLE = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def test_each_verdict_arrives_one_step_later_and_the_last_on_draining():
    consensus = StepConsensus(SINGLE)
    assert consensus.exchange(1, 0.5, stop_vote=False, details={"epoch": 0}) is None
    verdict = consensus.exchange(2, 0.25, stop_vote=True)
    assert (verdict.step, verdict.mean_loss, verdict.stop_requested, verdict.details) == (
        1,
        0.5,
        False,
        {"epoch": 0},
    )
    last = consensus.drain()
    assert (last.step, last.mean_loss, last.stop_requested) == (2, 0.25, True)
    assert consensus.drain() is None


def test_settling_reads_the_pending_verdict_now_and_leaves_it_for_the_next_exchange():
    consensus = StepConsensus(SINGLE)
    assert consensus.settle() is None
    consensus.exchange(1, float("inf"), stop_vote=False)
    settled = consensus.settle()
    assert (settled.step, settled.mean_loss) == (1, float("inf"))
    assert consensus.exchange(2, 0.5, stop_vote=False) == settled
    assert consensus.drain().step == 2 and consensus.settle() is None
