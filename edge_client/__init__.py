"""The edge client: one process hosting one or many devices (`fedmask client`).

Public API, by module (nothing is re-exported here, so importing one module
never pulls torch or grpc needlessly):

    edge_client.app        ClientConfig, EdgeClient (prepare / run / stop), run_client
    edge_client.session    SessionDriver: ServerMessage in, ClientMessages out
                           (dispatch to the modules below)
    edge_client.devices    Device (the one device type), local_id_of
    edge_client.local_data LocalData: per-device local splits; load_interactions
    edge_client.task       TaskSpec (the training part of a RoundTask)
    edge_client.trainer    Trainer: batched local training with the engine's
                           functions, DP, private state; TrainingFailure;
                           synthetic_updates (benchmark mode)
    edge_client.global_model LatestGlobal: the latest public global model
    edge_client.round_run  RoundRun: one round's state, replies, metrics
    edge_client.secure_update  the secure path (round secret, secagg stages)
    edge_client.plaintext  the INSECURE plaintext path (opt-in)
    edge_client.queries    top-k DeviceRequests, scored on the device
    edge_client.transport  TransportConfig (TLS / mTLS / token), make_channel,
                           enroll, run_session
    edge_client.state      ClientStore / DeviceStore: atomic, checksummed files
                           under --state-dir; StateCorruptError
    edge_client.backoff    Backoff: exponential backoff with full jitter
    edge_client.faults     FaultPlan: --drop-rate/--drop-stage, --crash-after-round, --delay-ms
    edge_client.users      parse_user_ranges ("1-100,200"), check_users_fit

Boundaries: imports `secagg`, `models`, `wire`, `fedmask_proto`, grpc; never
`coordinator`. Private device state stays under --state-dir.
"""
