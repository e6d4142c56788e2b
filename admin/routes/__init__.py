"""The admin API's routes, one `APIRouter` per area; `admin.app.create_app`
includes them in the order listed here, which is the order of the OpenAPI
document's paths and of route matching (`/v1/rounds/current` before
`/v1/rounds/{number}`):

  health           GET /healthz, /readyz (open)
  dashboard        GET / and /static/{name} (open; not in the document)
  meta             GET /metrics (viewer), /openapi.json (any role)
  federation       GET /v1/federation, /v1/rounds, /v1/rounds/current, /v1/rounds/{number}
  model_versions   GET /v1/models, /v1/models/{version}, /v1/models/{version}/parameters
  ledger           GET /v1/privacy, /v1/audit
  events           GET /v1/events (Server-Sent Events)
  recommendations  GET /v1/devices/{device_id}/recommendations, /v1/users/{user}/recommendations
  actions          POST /v1/federation/pause, /resume, /v1/rounds/current/abort,
                   /v1/models/{version}/rollback (operator)

A module whose parameter bounds come from the settings (a listing's page
size) builds its router per app with `router(settings)`; the others have one
module-level `router`. Routes reach the app's services through
`admin.deps.ServicesDep`, never through module state.
"""
