"""The admin service (`fedmask admin`): a stateless FastAPI process over the
coordinator's store (history, read only) and the coordinator's gRPC admin
listener (live state, events, operator actions, top-k relay).

    settings = AdminSettings.load(config_file="admin.toml")
    app = create_app(settings)          # admin.app
    uvicorn.run(app, ...)

Import contract (tests/test_boundaries.py, docs/architecture.md): admin may
import `coordinator.store` (interface, records, errors, blobs), the generated
stubs `fedmask_proto` and the shared `wire` helpers, never the coordinator's
runtime modules.
"""
