"""Names of the Redis keys a job uses. Shared by the site and the learner, so both agree on them.

prompts       stream of prompt groups (fields: group_id, prompt); consumer group ``leases`` hands
              them to workers, one entry per lease.
trajectories  stream of accepted groups (field: data = JSON list of records); consumer group
              ``learner`` feeds the trainer, which acknowledges an entry only once trained or dropped.
counters      hash of per-job counters (accepted, rejected, ...).
"""

PROMPT_GROUP = "leases"
LEARNER_GROUP = "learner"


def prompts_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:prompts"


def trajectories_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:trajectories"


def counters_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:counters"
