"""The secure update path: a device's trained update goes out masked, through
its secagg client states.

- `advertise(run, dr, row, update)`: the device's update (row `row` of the
  trained batch) is encoded with the round's fixed-point encoding; a fresh
  32-byte round secret is written to the device's state dir *before* its
  `ClientAdvertiseKeys.start()` (the secret seeds the DRBG from which secagg
  draws every per-round secret of the device), and its AdvertiseKeys is sent.
  With removable noise (D110) the n - t noise-component seeds are drawn from
  the same secret: the encoding adds the components, secagg shares the seeds.
- With a device CA (`--device-ca`, active mode only, D33): the device's own
  identity certificate goes out with its AdvertiseKeys, and every peer in
  its AdvertisedKeys must carry a certificate that verifies against the
  device's own copy of the device CA, for the relayed identity key and the
  peer's device id (`secagg.device_certificates`). One that does not means
  the coordinator relayed a key no device CA vouches for: the device
  withdraws before it shares anything (AbortNotice INVALID_SIGNATURE), so
  its secrets and input never reach a substituted key.
- `answer_stage(run, dr, field, message)`: one server stage message for the
  device (ServerMessage oneof `field`, a key of `wire.protocol.SERVER_FIELD_STAGE`)
  is converted by `wire`, handed to the device's secagg state, and the reply
  sent. A device set to drop at that stage goes silent instead. A malformed
  message (WireError) makes the device leave the round with a ClientAbort
  (AbortNotice PROTOCOL_VIOLATION); so does any failed secagg check.
  Once the device has answered unmasking, aborted or dropped, its part is
  over and its round secret is wiped (`RoundRun.finish_device`).
- `decline_unfinished_rounds(devices)`: at start-up, a round secret left on
  disk (the process stopped mid-round) is wiped: the device declines that
  round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from cryptography import x509
from cryptography.hazmat.primitives import serialization

import wire
from dpmech.removable_encoding import new_seeds
from edge_client.contributions import Contributions
from edge_client.devices import Device
from edge_client.round_run import DeviceRound, RoundRun
from edge_client.state import RoundSecret, StateCorruptError
from fedmask_proto.v1 import common_pb2, secagg_pb2
from secagg import messages as sm
from secagg.device_certificates import certificate_refusal, certificate_request
from secagg.client import ClientAborted, ClientAdvertiseKeys, ClientCompleted
from secagg.errors import AbortReason
from secagg.randomness import DeterministicRandom
from secagg.stages import Stage
from wire import secagg_codec
from wire.protocol import SERVER_FIELD_STAGE

log = logging.getLogger("edge_client.session")

ROUND_SECRET_LABEL = b"fedmask/edge_client/round-secret/v1"
ROUND_SECRET_BYTES = 32
COMPONENT_SEEDS_LABEL = b"fedmask/edge_client/removable-noise-seeds/v1"


async def advertise(run: RoundRun, dr: DeviceRound, row: int, update: np.ndarray) -> None:
    view = run.view
    dev = dr.device
    async with dr.lock:
        if dr.done or run.over:
            return
        dr.row = row
        seed = run.io.secure_random(ROUND_SECRET_BYTES)
        # removable noise (D110): the component seeds come from the round secret, as every secagg secret does
        components = () if view.removable is None else new_seeds(
            view.removable, DeterministicRandom(seed, COMPONENT_SEEDS_LABEL))
        encoded = await run.encode(dr, update, components)
        # durable BEFORE the keys exist anywhere else
        await asyncio.to_thread(dev.store.save_round_secret, RoundSecret(view.session_id, view.round_number, seed))
        active = view.config.active_adversary
        if active:
            dr.identity[dr.secagg_id] = dev.identity_public
            if run.io.device_ca is not None:
                why = await asyncio.to_thread(own_certificate_refusal, dev, run.io.device_ca)
                if why is not None:  # its peers would refuse it: it does not take part
                    log.error("round %d, %s: %s; the device does not take part (have the device CA sign %s: "
                              "fedmask certs issue-device)", view.round_number, dev.local_id, why,
                              dev.store.certificate_request_path)
                    run.io.send(abort=common_pb2.AbortNotice(
                        session_id=view.session_id, round_number=view.round_number, device_id=dev.device_id,
                        reason=common_pb2.ABORT_REASON_CLIENT_ERROR, detail="no valid identity certificate"))
                    run.finish_device(dr)
                    return
                certificate = await asyncio.to_thread(dev.store.load_identity_certificate)
                dr.certificate = certificate or b""
        state = ClientAdvertiseKeys(
            view.config,
            dr.secagg_id,
            view.round_number,
            encoded,
            rand=DeterministicRandom(seed, ROUND_SECRET_LABEL),
            identity_key=dev.identity_key if active else None,
            peer_identity_keys=dr.identity if active else None,
            removable_seeds=components,
        )
        del encoded

        def start() -> tuple[Any, sm.AdvertiseKeys, list[Any]]:  # key generation, off the event loop
            nxt, out = state.start()
            own = out[0]
            assert isinstance(own, sm.AdvertiseKeys)
            return nxt, own, run.encode_replies(dr, out)

        dr.state, dr.own, protos = await run.compute(start)
        await run.send_encoded(dr, protos)


async def answer_stage(run: RoundRun, dr: DeviceRound, field_name: str, p: Any) -> None:
    stage = SERVER_FIELD_STAGE[field_name]
    async with dr.lock:
        if dr.done or run.over or dr.state is None:
            return
        if dr.drop_at == stage:
            run.go_silent(dr, stage)
            return
        view = run.view
        # decoding, the state machine's step and encoding the replies run on a
        # worker thread (the device's lock is held): the event loop only routes
        # messages, so it keeps reading the stream (a top-k request queued behind
        # a round's fifty relayed key lists waits for all of them to be read)
        try:
            decoded = await run.compute(_decode_stage, run, dr, stage, p)
        except wire.WireError as e:
            log.warning("round %d, %s: malformed %s: %s; the device leaves the round",
                        view.round_number, dr.device.local_id, field_name, e)
            state, out = dr.state.abort(AbortReason.MALFORMED_MESSAGE, f"malformed {field_name}: {e}")
            dr.state = state
            await run.reply(dr, out, delay=False)
            run.finish_device(dr)
            return
        if isinstance(decoded, str):  # a relayed key no device CA vouches for
            log.error("round %d, %s: %s; the device withdraws (a key no device CA vouches for)",
                      view.round_number, dr.device.local_id, decoded)
            state, out = dr.state.abort(AbortReason.INVALID_SIGNATURE, decoded)
            dr.state = state
            await run.reply(dr, out, delay=False)
            run.finish_device(dr)
            return
        current = dr.state
        if dr.done or run.over or current is None:  # the round ended while the message was decoded
            return
        if stage is Stage.UNMASKING and not await _claim_contribution(run, dr):
            return

        def step() -> tuple[Any, list[Any]]:
            nxt, replies = current.handle(decoded)
            replies = run.io.faults.falsify_receipts(decoded, replies, view.ids.device)  # fault injection
            dr.state = nxt  # encode_replies reads the new state (an abort's detail)
            return nxt, run.encode_replies(dr, replies)

        state, protos = await run.compute(step)
        dr.state = state
        await run.send_encoded(dr, protos)
        if isinstance(state, ClientAborted):
            log.warning("round %d, %s: left the round: %s (%s)", view.round_number, dr.device.local_id,
                        state.reason.value, state.detail)
            run.finish_device(dr)
        elif isinstance(state, ClientCompleted):
            run.finish_device(dr)


async def _claim_contribution(run: RoundRun, dr: DeviceRound) -> bool:
    """Before a device answers unmasking (the one step that lets the
    coordinator remove its masks from a sum), its contribution is recorded
    durably (edge_client.contributions, D85); a device that may not contribute
    withdraws instead. True: go on and answer."""
    rule = run.io.contribution_rule
    if rule is None:
        return True
    why = await asyncio.to_thread(Contributions(dr.device.store.folder, rule).claim, run.training_key, time.time())
    if why is None:
        return True
    view = run.view
    log.error("round %d, %s: %s; the device withdraws before unmasking", view.round_number, dr.device.local_id, why)
    run.io.send(abort=common_pb2.AbortNotice(
        session_id=view.session_id, round_number=view.round_number, device_id=dr.device.device_id,
        reason=common_pb2.ABORT_REASON_CLIENT_ERROR, detail=why[: secagg_codec.MAX_DETAIL_CHARS]))
    run.finish_device(dr)
    return False


def own_certificate_refusal(dev: Device, ca: x509.Certificate) -> str | None:
    """None when the device's stored identity certificate verifies against
    `ca` for its identity key and device id; otherwise why not."""
    try:
        der = dev.store.load_identity_certificate()
    except StateCorruptError as e:
        return str(e)
    if der is None:
        return "no identity certificate yet"
    return certificate_refusal(der, ca, dev.identity_public, dev.device_id, now=datetime.now(UTC))


def write_certificate_request(dev: Device) -> Path:
    """Write the device's certificate request (CN = its device id, signed by
    its identity key) for the operator to sign; returns its path."""
    csr = certificate_request(dev.require_identity_key(), dev.device_id)
    dev.store.save_certificate_request(csr.public_bytes(serialization.Encoding.PEM))
    return dev.store.certificate_request_path


def _decode_stage(run: RoundRun, dr: DeviceRound, stage: Stage, p: Any) -> sm.Message | str:
    """The secagg message of a relayed stage message (WireError if malformed),
    or, for a key list with a peer no device CA vouches for, why not. Runs on a
    worker thread under the device's lock (it updates dr.identity)."""
    view = run.view
    if stage is Stage.SHARE_KEYS:  # AdvertisedKeys: the key list to share with
        assert dr.own is not None
        msg, ident = secagg_codec.key_list_from_proto(
            p, view.ids, dr.own,
            own_identity_public_key=dr.device.identity_public if view.config.active_adversary else None,
        )
        dr.identity.update(ident)
        refusal = peer_certificates_refusal(run, p)
        return msg if refusal is None else refusal
    return wire.server_from_proto(p, view.ids)


def peer_certificates_refusal(run: RoundRun, keys: secagg_pb2.AdvertisedKeys) -> str | None:
    """None when no device CA is configured, the round is not in active
    mode, or every relayed peer's certificate verifies against the device's
    own device CA for the relayed identity key and the peer's device id;
    otherwise why not (the first failing peer)."""
    ca = run.io.device_ca
    if ca is None or not run.view.config.active_adversary:
        return None
    now = datetime.now(UTC)
    for peer in keys.peers:
        why = certificate_refusal(bytes(peer.identity_certificate), ca, bytes(peer.identity_public_key),
                                  int(peer.device_id), now=now)
        if why is not None:
            return why
    return None


def decline_unfinished_rounds(devices: Iterable[Device]) -> int:
    """At start-up: a round secret left on disk means the process stopped
    mid-round. The device declines that round (its secret is wiped; the
    coordinator already counts it as dropped). Returns how many were found."""
    n = 0
    for dev in devices:
        try:
            secret = dev.store.load_round_secret()
        except StateCorruptError:
            # what a crash in the middle of the wipe (secure_delete: zeroes, then
            # unlink) leaves behind; the secret is of no use after a restart anyway
            log.warning("%s: unreadable round secret left by a crash; wiping it", dev.local_id)
            dev.store.clear_round_secret()
            n += 1
            continue
        if secret is not None:
            log.warning("%s: declining unfinished round %d after a restart", dev.local_id, secret.round_number)
            dev.store.clear_round_secret()
            n += 1
    return n
