"""Two tenants of one tier, one submitting 10x more: output tokens shared about equally."""

from __future__ import annotations

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.request import Request, SamplingParams
from loraplex.engine.scheduler import ModelRunnerOutput, Scheduler


def make_scheduler(policy: str) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, scheduling_policy=policy)
    return Scheduler(config, KVCacheManager(256, 4), max_model_len=64)


def served_shares(policy: str) -> tuple[int, int]:
    s = make_scheduler(policy)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    n = 0
    for i in range(40):  # the noisy tenant floods first...
        s.add_request(
            Request(
                f"noisy{i}",
                [1, 2, 3, 4],
                params,
                fairness_key="noisy",
                priority=1,
                arrival_time=float(n),
            )
        )
        n += 1
    for i in range(4):  # ...then the quiet one sends a tenth as many
        s.add_request(
            Request(
                f"quiet{i}",
                [1, 2, 3, 4],
                params,
                fairness_key="quiet",
                priority=1,
                arrival_time=float(n),
            )
        )
        n += 1
    output_tokens = {"noisy": 0, "quiet": 0}
    while any(r.fairness_key == "quiet" for r in s.requests.values()):
        out = s.schedule()
        sampled = {x.request.request_id: 7 for x in out.scheduled if x.needs_sample}
        for x in out.scheduled:
            if x.needs_sample:
                output_tokens[x.request.fairness_key] += 1
        s.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
        s.kv_cache_manager.check_integrity()
    return output_tokens["noisy"], output_tokens["quiet"]


def test_equal_tier_tenants_share_output_tokens():
    noisy, quiet = served_shares("priority")
    # While both had work waiting, each got within 20% of an equal share.
    assert abs(noisy - quiet) <= 0.2 * (noisy + quiet) / 2, (noisy, quiet)


def test_fcfs_lets_the_flood_starve_the_quiet_tenant():
    noisy, quiet = served_shares("fcfs")
    assert noisy > 5 * quiet  # the contrast that makes the test above meaningful
