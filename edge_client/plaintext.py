"""INSECURE plaintext rounds (benchmark baseline; the client side of
`coordinator/plaintext.py`).

A coordinator started with `--debug-insecure-plaintext` (loopback only)
marks its RoundTasks with the `insecure_plaintext` hyper-parameter
(`wire.protocol.PLAINTEXT_HYPERPARAMETER`). Only a client started with
`--debug-allow-insecure-plaintext` answers such a round (the session driver
refuses it otherwise): each device sends its encoded update *unmasked* in a
MaskedInput message, with no secagg state and no round secret, and its part
of the round is over. A device set to drop at share-keys or masked-input
stays silent; the later drop stages do not exist in this mode. The
coordinator learns every device's update: never use it with real data.
"""

from __future__ import annotations

import numpy as np

from edge_client.round_run import DeviceRound, RoundRun
from secagg import messages as sm
from secagg.stages import Stage

#: Drop stages at which a device stays silent in a plaintext round.
SILENT_AT = (Stage.SHARE_KEYS, Stage.SHARE_CHECK, Stage.MASKED_INPUT)


async def upload(run: RoundRun, dr: DeviceRound, row: int, update: np.ndarray) -> None:
    view = run.view
    async with dr.lock:
        if dr.done or run.over:
            return
        dr.row = row
        if dr.drop_at is not None and dr.drop_at in SILENT_AT:
            run.go_silent(dr, dr.drop_at)
            return
        encoded = await run.encode(dr, update)
        msg = sm.MaskedInput(session_id=view.session_id, round_idx=view.round_number, device_id=dr.secagg_id,
                             vector=encoded)
        await run.reply(dr, [msg])
        run.finish_device(dr)
