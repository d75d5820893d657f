"""Jobs: their records (records.py) and the queue the workers serve (queue.py).

app.py and the routers import these names from here until they import them from the
two modules.
"""

from hotplate.serve.queue import JobQueue, Stats
from hotplate.serve.records import (
    COLUMNS,
    FINISHED,
    Job,
    JobRecords,
    claim_data_dir,
    new_id,
    remove,
    snapshot,
)

__all__ = [
    "COLUMNS",
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
