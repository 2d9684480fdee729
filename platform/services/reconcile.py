"""Start-up reconciliation of the adapter store with the registry.

A crash between writing an adapter's files and committing its row (or between deleting a row
and its files) leaves files no row uses; a crash mid-upload leaves a staging directory. Both are
removed here. A row whose files are gone (someone deleted them by hand) is marked `failed`, so it
is never served and the listing says why. The store's locks keep this from touching what a live
process is still writing (see `storage.py`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import select

from loraplex.platform.db import Adapter, AdapterStatus, Database
from loraplex.platform.storage import AdapterStore

logger = logging.getLogger(__name__)

MISSING_FILES = "the adapter's files are missing from the adapter store"


@dataclass
class Reconciliation:
    removed_staging: list[str] = field(default_factory=list)
    removed_orphans: list[str] = field(default_factory=list)
    failed_rows: list[int] = field(default_factory=list)


def reconcile_adapters(db: Database, store: AdapterStore) -> Reconciliation:
    report = Reconciliation(removed_staging=store.remove_abandoned_staging())
    with store.removing(), db.session() as session:
        on_disk = store.content_hashes()
        rows = session.execute(select(Adapter.id, Adapter.sha256, Adapter.status)).all()
        for content_hash in sorted(on_disk - {row.sha256 for row in rows}):
            store.remove(content_hash)
            report.removed_orphans.append(content_hash)
        for row in rows:
            if row.sha256 not in on_disk and row.status != AdapterStatus.FAILED.value:
                adapter = session.get(Adapter, row.id)
                assert adapter is not None
                adapter.status = AdapterStatus.FAILED.value
                adapter.status_reason = MISSING_FILES
                report.failed_rows.append(row.id)
        session.commit()
    if report.removed_staging or report.removed_orphans or report.failed_rows:
        logger.warning(
            "adapter store reconciled: removed %d abandoned uploads and %d files no adapter "
            "uses; %d adapters whose files are missing marked failed",
            len(report.removed_staging),
            len(report.removed_orphans),
            len(report.failed_rows),
        )
    return report
