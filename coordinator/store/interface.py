"""The Store interface: everything the coordinator persists.

Implementations: `InMemoryStore` (tests, simulations) and `SqlStore`
(SQLite file by default, PostgreSQL by URL). Both honour the same contract,
checked by the parametrized suite in tests/coordinator/.

Contract (all implementations):
  * Every method is atomic: it fully happens or leaves the store unchanged.
  * Methods are thread-safe and safe under concurrency: any number of
    threads (and, on SQL, processes) may call them at once on the same
    database and every call either succeeds or raises for its own reason
    (never "database is locked"). SQL stores begin read-only methods as
    read transactions and every other method as a write transaction
    (SQLite: BEGIN IMMEDIATE, waiting for the write lock; PostgreSQL: READ
    COMMITTED with row locks, deadlocks and serialization failures retried
    a bounded number of times); see coordinator.store.transactions and
    decision D23. The coordinator calls them from worker threads (never
    from the event loop directly, since the SQL backend blocks).
  * Errors are the types of coordinator.store.errors only.
  * Round numbers are the public identity of rounds (unique, >= 1); once a
    round is terminal (committed/aborted) it is never written again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from coordinator.store.records import (
    AuditRecord,
    DeviceRecord,
    DeviceStatus,
    ModelVersion,
    ModelVersionSummary,
    NewModelVersion,
    Page,
    PrivacyEntry,
    PrivacySummary,
    RoundRecord,
)
from coordinator.store.lease_records import Lease
from coordinator.store.group_interface import GroupStore
from coordinator.store.group_records import ChargeRule
from coordinator.store.replica_interface import ReplicaStore
from coordinator.store.report_records import Quarantine, ShareReport


@runtime_checkable
class Store(ReplicaStore, GroupStore, Protocol):
    """Everything the coordinator persists; the replica tier's methods
    (membership, stream ownership) are those of `ReplicaStore`, its rounds
    in groups (plans, group rows, sums, sealing) those of `GroupStore`."""

    # ------------------------------------------------------------ devices
    def enroll_devices(
        self, devices: Sequence[tuple[bytes, str]], *, client_id: str | None = None
    ) -> list[tuple[DeviceRecord, bool]]:
        """Enrol a batch of (identity public key, local_id) in ONE
        transaction, all or nothing: either every device is enrolled (or
        found enrolled) or the store is unchanged. Returns (record,
        newly_enrolled) per device, in the order given. Idempotent per key:
        an enrolled key returns its existing record (newly_enrolled False;
        its local_id/client_id are not changed), also when a concurrent
        call enrolled it first.
        A non-empty local_id is the device's user handle, unique in the
        store: a new key whose local_id another device holds is refused.
        Raises InvalidRecordError (an empty key, a key or non-empty local_id
        listed twice) and EnrollmentConflictError when an already-enrolled
        key is revoked or belongs to another client id (both ids known and
        different), or a new key's local_id is taken (HANDLE_TAKEN, also
        when a concurrent call took it first): then no device of the batch
        is written. An empty batch returns []."""
        ...

    def enroll_device(
        self, identity_public_key: bytes, *, local_id: str = "", client_id: str | None = None
    ) -> tuple[DeviceRecord, bool]:
        """`enroll_devices` of one device: its (record, newly_enrolled)."""
        ...

    def get_device(self, device_id: int) -> DeviceRecord | None: ...

    def get_device_by_local_id(self, local_id: str) -> DeviceRecord | None:
        """The device whose user handle (local_id) is `local_id`; None for
        an empty or unknown one."""
        ...

    def list_devices(self, *, status: DeviceStatus | None = None) -> list[DeviceRecord]:
        """All devices (optionally of one status), ascending id."""
        ...

    def count_devices(self) -> dict[DeviceStatus, int]:
        """How many devices have each status (statuses with none left out),
        counted in the store, never by listing the rows."""
        ...

    def mark_devices_seen(self, device_ids: Iterable[int], at: datetime | None = None) -> None:
        """Set last_seen_at (default: the store clock); unknown ids are ignored."""
        ...

    def set_device_status(self, device_id: int, status: DeviceStatus) -> DeviceRecord:
        """Raises NotFoundError for an unknown device."""
        ...

    # ------------------------------------------------------ model versions
    def add_model_version(self, version: NewModelVersion, *, fence: Lease | None = None) -> ModelVersionSummary:
        """Store a model version produced outside a round (the initial model,
        a rollback, a skip past a spent version); round_number is None.
        Fenced as commit_round (a replica's default fence when none is
        given): raises FencedOut, nothing written, for a deposed leader."""
        ...

    def latest_model_version(self, model_name: str | None = None) -> ModelVersion | None:
        """The newest version (of `model_name`, if given), or None.
        Raises CorruptBlobError when its blob does not match its sha256."""
        ...

    def get_model_version(self, version_id: int) -> ModelVersion:
        """Raises NotFoundError, CorruptBlobError."""
        ...

    def list_model_versions(
        self, *, limit: int = 50, before: int | None = None
    ) -> Page[ModelVersionSummary]:
        """Newest first, without blobs; `before` is an exclusive version id."""
        ...

    # -------------------------------------------------------------- rounds
    def next_round_number(self) -> int:
        """ALLOCATE a round number (a write): greater than every round
        number stored and every number this method returned before, on
        this database. Two calls never return the same number, also when
        they run concurrently (in threads or processes); this is what makes
        round numbers race-free: a round's writer allocates its number here
        and then uses it in save_round_progress / commit_round /
        abort_round, which insert the round or update it in place, so a
        number must come from here (the unique key on the number turns an
        accidental duplicate insert into ConflictError). A number whose
        round is never written leaves a gap. 1 on an empty store."""
        ...

    def save_round_progress(self, record: RoundRecord) -> None:
        """Insert or update a round in a NON-terminal state (the state machine
        calls it at every stage change, so a crash leaves the round visible).
        Raises InvalidRecordError for a terminal state, ConflictError if the
        stored round is already terminal."""
        ...

    def commit_round(
        self,
        round_record: RoundRecord,
        new_model_version: NewModelVersion,
        privacy_entry: PrivacyEntry | None,
        *,
        fence: Lease | None = None,
    ) -> ModelVersionSummary:
        """In ONE transaction: write the round in state COMMITTED (insert or
        update), store the model version it produced (round_number set) and
        its privacy-ledger entry (None when DP is off), and seal its groups
        (group_interface: open groups lost, sums deleted, the plan's
        new_model_version set). All or nothing.
        With `fence` (a replicated coordinator's lease), the same transaction
        first checks that the lease still names that holder and token.
        Raises InvalidRecordError (state not COMMITTED, entry for another
        round), ConflictError (round already terminal), FencedOut (the
        fence's holder was deposed; nothing written)."""
        ...

    def abort_round(self, round_record: RoundRecord, *, fence: Lease | None = None,
                    privacy_entry: PrivacyEntry | None = None) -> None:
        """Write the round in state ABORTED (insert or update) and seal its
        groups (group_interface), with
        `privacy_entry` (a round whose sum its coordinator may have learned
        although it aborts, D94) in the same transaction.
        Raises InvalidRecordError, ConflictError, FencedOut as commit_round."""
        ...

    def mark_interrupted_rounds_aborted(self, *, at: datetime | None = None, charge: ChargeRule | None = None,
                                        fence: Lease | None = None) -> list[int]:
        """Crash recovery, called at start-up before any round runs: every
        round in a non-terminal state becomes ABORTED with abort_reason
        'coordinator_restart' and ended_at `at` (default: store clock).
        Returns their numbers, ascending.

        A round with a plan (group_interface) is sealed as by abort_round,
        and the devices its groups may have asked to unmask (the `asked` of
        groups in `unmasking` or `done`, lost in `unmasking`, or failed
        after asking: `GroupRow.may_have_asked`) are added to
        the stored record's `survivors["unmasking"]`, so the spent-device
        rules count them.

        With `charge`, in the SAME transaction, for each of those rounds in
        ascending order: `charge(found, ledger, groups)`, where `found` is
        the round as stored before this call (its non-terminal state),
        `ledger` the privacy ledger as it stands (ascending; the entries
        this call added for earlier rounds included) and `groups` the
        round's group rows after the seal (by index; empty for a round
        without a plan), returns the round's privacy-ledger
        entry (a release its dead coordinator may have learned, D94) or
        None; each entry is stored with its round, all or nothing. A rule
        that raises leaves the store unchanged. May run more than once per
        call (a retried transaction): it must be pure. Fenced as
        commit_round. Raises InvalidRecordError (an entry for another
        round), ConflictError (the round already has an entry), FencedOut."""
        ...

    def get_round(self, number: int) -> RoundRecord | None: ...

    def list_rounds(self, *, limit: int = 50, before: int | None = None) -> Page[RoundRecord]:
        """Newest first; `before` is an exclusive round number."""
        ...

    # ------------------------------------------------------------- privacy
    def privacy_ledger(self) -> list[PrivacyEntry]:
        """All entries, ascending round number."""
        ...

    def privacy_summary(self) -> PrivacySummary: ...

    # ----------------------------------------------------------- audit log
    def append_audit(
        self, *, operator: str, action: str, outcome: str,
        details: Mapping[str, Any] | None = None, at: datetime | None = None,
    ) -> AuditRecord:
        """Append one operator action to the audit log (`at` defaults to the
        store clock); returns it with its id (ascending, never reused).
        Raises InvalidRecordError for an empty or over-long operator,
        action or outcome (records.check_audit_fields) or details that are
        not a JSON object."""
        ...

    def list_audit(self, *, limit: int = 50, before: int | None = None) -> Page[AuditRecord]:
        """Newest first; `before` is an exclusive entry id."""
        ...

    # ------------------------------------------- share reports (D37)
    # The store only persists; coordinator/peer_reports.py decides.
    def add_share_reports(self, reports: Sequence[ShareReport]) -> None:
        """Append counted share-check reports (duplicates are kept; the
        rule counts distinct credentials and rounds)."""
        ...

    def list_share_reports(self) -> list[ShareReport]:
        """Every stored report, ordered by (round_number, reporter, reported)."""
        ...

    def forget_share_reports(self, *, before_round: int, before: datetime) -> None:
        """Delete the reports of rounds before `before_round` or made before `before`."""
        ...

    def add_quarantines(self, quarantines: Sequence[Quarantine]) -> list[Quarantine]:
        """In ONE transaction: store the quarantines (new ids, ascending, never
        reused; the given ids are ignored) and delete every stored report
        about their devices. Returns them with their ids, in order."""
        ...

    def list_quarantines(self) -> list[Quarantine]:
        """Every stored quarantine, ascending id."""
        ...

    def release_quarantines(self, ids: Iterable[int], at: datetime) -> None:
        """Set released_at = `at` on those of `ids` not released yet;
        unknown ids are ignored."""
        ...

    def forget_quarantines(self, ids: Iterable[int]) -> None:
        """Delete those quarantines; unknown ids are ignored."""
        ...

    # ---------------------------------------------------- the leader lease (D90)

    def acquire_lease(self, holder: str, seconds: float) -> Lease | None:
        """Take the leader lease for `seconds` by the store's clock when it is
        free or expired (its token grows by one), or renew it when `holder`
        holds it (same token). None when another holder's lease still runs.
        Raises InvalidRecordError for an empty holder or a duration outside
        (0, 3600] s."""
        ...

    def release_lease(self, lease: Lease) -> None:
        """End `lease` now if it is still the current term (a clean shutdown,
        so another replica need not wait for the expiry); otherwise nothing."""
        ...

    def current_lease(self) -> Lease | None:
        """The running lease (its remaining seconds by the store's clock), or
        None when no replica leads."""
        ...

    def fence_writes(self, fence: Callable[[], Lease]) -> None:
        """From now on, `commit_round` and `abort_round` called without a
        fence are fenced with `fence()` (a leading replica's current lease).
        Set once, before the first round; there is no way back to unfenced."""
        ...

    def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...
