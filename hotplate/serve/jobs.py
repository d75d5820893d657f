"""Jobs: their records (records.py) and the queue the workers serve (queue.py).

hotplate/serve/app.py imports these names from here until its router split imports
them from the two modules.
"""

from hotplate.serve.queue import JobQueue, Stats
from hotplate.serve.records import (
    FINISHED,
    Job,
    JobRecords,
    claim_data_dir,
    new_id,
    remove,
    snapshot,
)

__all__ = [
    "FINISHED",
    "Job",
    "JobQueue",
    "JobRecords",
    "Stats",
    "claim_data_dir",
    "new_id",
    "remove",
    "snapshot",
]
