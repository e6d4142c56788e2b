# `make demo` runs the main job, `make test` the whole suite. Both create .venv
# and install the pinned dependencies first; nothing else is needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup test demo screenshot bench clean images base-images wheelhouse up down gpu-check gpu-check-reference

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

demo: setup
	$(VENV)/bin/fedmask demo

# `make screenshot` renews docs/admin-dashboard.png (the README's picture): the
# demo's ML-100K federation (`fedmask demo --keep-running`, 16 rounds, the
# picture after 12 committed: about 2 to 3 minutes on 2 cores) seen in
# headless system Chromium (.ci/ensure-chromium); every process it starts is
# stopped at the end. Options: $(PY) scripts/dashboard_screenshot.py --help.
screenshot: setup
	$(PY) scripts/dashboard_screenshot.py

bench: setup
	$(PY) -m secagg.bench --clients 100 --dim 53824 --neighbors all --dropout 0.1 --dropout-stage unmasking --seed 0

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache deploy/.wheelhouse deploy/.state .gpu-site

# ---------------------------------------------------------------- accelerator
# `make gpu-check OUT=DIR` proves and times fedmask on a CUDA GPU in one command
# (docs/gpu.md): the `cuda` tests, FedRAP for 100 rounds on ML-100K and the
# ML-1M-shaped population on the GPU, 5 rounds on the GPU and on the CPU cores
# (parameters compared), the full runs against the CPU reference in
# $(REFERENCE) when it exists, and a gRPC federation with a GPU client. Last
# line: one JSON object. It runs on .venv when there is one, else on the
# machine's python3 with the wheels of .whl/ (scripts/gpu_check_wheels.sh)
# installed into .gpu-site/ (a machine with no network).
REFERENCE ?= gpu-ref
GPU_PY     = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	@test -n "$(OUT)" || { echo "usage: make gpu-check OUT=DIR [REFERENCE=$(REFERENCE)]" >&2; exit 2; }
	@if [ ! -x $(PY) ] && [ -d .whl ]; then \
	    $(PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu-site .whl/*.whl; fi
	PYTHONPATH=$(CURDIR)/.gpu-site$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) scripts/gpu_check.py --out $(OUT) \
	    $(if $(wildcard $(REFERENCE)/ml1m.json),--reference $(REFERENCE))

# The CPU reference of the full runs (FedRAP, 100 rounds, both populations) on this machine's CPU.
gpu-check-reference: setup
	$(PY) scripts/gpu_check.py --make-reference --out $(REFERENCE)

# ---------------------------------------------------------------- containers
# `make images` builds the fedmask images with podman (deploy/README.md):
# the coordinator, admin and client images (one Containerfile, a final stage
# per role) and, while POSTGRES_IMAGE / HAPROXY_IMAGE are the local tags, a
# PostgreSQL image and an HAProxy image (the replicas' balancer) built from
# Debian packages. BASE_IMAGE defaults to a base built here from Debian
# packages (mmdebstrap: these machines reach no container registry); with a
# registry, pass BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm,
# POSTGRES_IMAGE=docker.io/library/postgres:15-bookworm and
# HAPROXY_IMAGE=docker.io/library/haproxy:2.6. TORCH_FLAVOR=cu126
# (for example) builds a CUDA client image from a CUDA wheelhouse.
export CONTAINERS_CONF ?= $(CURDIR)/deploy/podman/containers.conf
PODMAN         ?= podman
IMAGE_PREFIX   ?= localhost/
IMAGE_TAG      ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
BASE_IMAGE     ?= localhost/fedmask-base:bookworm
POSTGRES_IMAGE ?= localhost/fedmask-postgres:15
HAPROXY_IMAGE  ?= localhost/fedmask-haproxy:2.6
TORCH_FLAVOR   ?= cpu
CLIENT_TAG     := $(IMAGE_TAG)$(if $(filter cpu,$(TORCH_FLAVOR)),,-$(TORCH_FLAVOR))
DEPLOY_STATE   := deploy/.state
IMAGE_SOURCES  := $(shell git ls-files fedmask coordinator edge_client models secagg wire fedmask_proto fedmask_settings admin dpmech 2>/dev/null) \
                  pyproject.toml constraints.txt deploy/build-wheelhouse.sh
PODMAN_COMPOSE ?= $(VENV)/bin/podman-compose
COMPOSE        := $(PODMAN_COMPOSE) -f deploy/compose.yaml -p fedmask
COMPOSE_ENV    := FEDMASK_IMAGE_PREFIX=$(IMAGE_PREFIX) FEDMASK_IMAGE_TAG=$(IMAGE_TAG) \
                  FEDMASK_POSTGRES_IMAGE=$(POSTGRES_IMAGE) FEDMASK_HAPROXY_IMAGE=$(HAPROXY_IMAGE) \
                  FEDMASK_SECRETS_DIR=$(CURDIR)/deploy/.secrets
RUNTIME_IMAGE  := $(IMAGE_PREFIX)fedmask-runtime:$(IMAGE_TAG)-$(TORCH_FLAVOR)
# The admin service's runtime: the same wheels without PyTorch and what only
# PyTorch needs (D61).
ADMIN_RUNTIME_IMAGE := $(IMAGE_PREFIX)fedmask-runtime:$(IMAGE_TAG)-slim
ADMIN_LEAVE_OUT     := /(torch|sympy|mpmath|networkx|triton|nvidia_[a-z0-9_]+)-[0-9]
BUILD          := $(PODMAN) build --format docker

base-images:
	@if [ "$(BASE_IMAGE)" = localhost/fedmask-base:bookworm ]; then bash deploy/base/build-base.sh $(BASE_IMAGE); fi
	@if [ "$(POSTGRES_IMAGE)" = localhost/fedmask-postgres:15 ]; then \
	    bash deploy/base/build-base.sh localhost/fedmask-postgres-base:15-bookworm postgresql-15 && \
	    $(BUILD) -q -f deploy/postgres/Containerfile -t $(POSTGRES_IMAGE) deploy >/dev/null && \
	    echo "built $(POSTGRES_IMAGE)"; fi
	@if [ "$(HAPROXY_IMAGE)" = localhost/fedmask-haproxy:2.6 ]; then \
	    bash deploy/base/build-base.sh localhost/fedmask-haproxy-base:bookworm haproxy && \
	    $(BUILD) -q -f deploy/haproxy/Containerfile -t $(HAPROXY_IMAGE) deploy >/dev/null && \
	    echo "built $(HAPROXY_IMAGE)"; fi

wheelhouse: $(DEPLOY_STATE)/wheelhouse-$(TORCH_FLAVOR).stamp

deploy/.wheelhouse/$(TORCH_FLAVOR).list: $(DEPLOY_STATE)/wheelhouse-$(TORCH_FLAVOR).stamp

# The wheelhouse (and with it the fedmask wheel) is rebuilt when the code or the pins change.
$(DEPLOY_STATE)/wheelhouse-$(TORCH_FLAVOR).stamp: $(IMAGE_SOURCES)
	bash deploy/build-wheelhouse.sh $(TORCH_FLAVOR)
	@mkdir -p $(DEPLOY_STATE) && touch $@

# The runtime image (base + dependencies) is rebuilt only when the set of
# dependency wheels changes (deploy/.wheelhouse/FLAVOR.list, rewritten by the
# wheelhouse script only then): podman 4.3 never caches `COPY --from`, so it
# is built once and tagged.
RUNTIME_STAMP := $(DEPLOY_STATE)/runtime-$(IMAGE_TAG)-$(TORCH_FLAVOR).stamp
$(RUNTIME_STAMP): deploy/.wheelhouse/$(TORCH_FLAVOR).list deploy/docker/Containerfile.runtime
	$(BUILD) --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg TORCH_FLAVOR=$(TORCH_FLAVOR) \
	    -f deploy/docker/Containerfile.runtime -t $(RUNTIME_IMAGE) deploy
	@touch $@

ADMIN_RUNTIME_STAMP := $(DEPLOY_STATE)/runtime-$(IMAGE_TAG)-slim.stamp
$(ADMIN_RUNTIME_STAMP): deploy/.wheelhouse/cpu.list deploy/docker/Containerfile.runtime
	$(BUILD) --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg TORCH_FLAVOR=cpu \
	    --build-arg LEAVE_OUT='$(ADMIN_LEAVE_OUT)' \
	    -f deploy/docker/Containerfile.runtime -t $(ADMIN_RUNTIME_IMAGE) deploy
	@touch $@

images: base-images wheelhouse
	@$(PODMAN) image exists $(RUNTIME_IMAGE) || rm -f $(RUNTIME_STAMP)
	@$(MAKE) --no-print-directory $(RUNTIME_STAMP)
	@if [ "$(TORCH_FLAVOR)" = cpu ]; then \
	    $(PODMAN) image exists $(ADMIN_RUNTIME_IMAGE) || rm -f $(ADMIN_RUNTIME_STAMP); \
	    $(MAKE) --no-print-directory $(ADMIN_RUNTIME_STAMP) || exit 1; \
	    $(BUILD) --build-arg RUNTIME_IMAGE=$(RUNTIME_IMAGE) -f deploy/docker/Containerfile --target coordinator \
	        -t $(IMAGE_PREFIX)fedmask-coordinator:$(IMAGE_TAG) deploy || exit 1; \
	    $(BUILD) --build-arg RUNTIME_IMAGE=$(ADMIN_RUNTIME_IMAGE) --build-arg CHECK=admin \
	        -f deploy/docker/Containerfile --target admin \
	        -t $(IMAGE_PREFIX)fedmask-admin:$(IMAGE_TAG) deploy || exit 1; fi
	$(BUILD) --build-arg RUNTIME_IMAGE=$(RUNTIME_IMAGE) -f deploy/docker/Containerfile --target client \
	    -t $(IMAGE_PREFIX)fedmask-client:$(CLIENT_TAG) deploy
	@$(PODMAN) images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'fedmask-(runtime|coordinator|admin|client|postgres|haproxy):' || true

# Secrets `make up` generates once and keeps in deploy/.secrets/ (git-ignored):
# the PostgreSQL passwords (the owner's, the coordinator's; fedmask_reader's,
# the admin service's SELECT-only role), the admin service's token on the
# coordinator's admin listener, and two REST API tokens (operator and
# recommender) whose SHA-256 entries go to admin-api-tokens.toml. The files
# are readable by the containers' user (0644 in a 0700 folder).
SECRETS       := deploy/.secrets
SECRET_FILES  := $(SECRETS)/postgres-password $(SECRETS)/postgres-reader-password $(SECRETS)/admin-token \
                 $(SECRETS)/admin-api-tokens.toml
$(SECRETS)/postgres-password $(SECRETS)/postgres-reader-password $(SECRETS)/admin-token:
	@mkdir -p $(SECRETS) && chmod 700 $(SECRETS)
	@$(PYTHON) -c "import secrets; print(secrets.token_hex(24))" > $@ && chmod 644 $@
	@echo "generated $@"

$(SECRETS)/admin-api-tokens.toml: | $(STAMP)
	@mkdir -p $(SECRETS) && chmod 700 $(SECRETS)
	@rm -f $@.new
	@for role in operator recommender; do \
	    $(PYTHON) -c "import secrets; print(secrets.token_urlsafe(32))" > $(SECRETS)/$$role-token && \
	    chmod 600 $(SECRETS)/$$role-token && \
	    $(VENV)/bin/fedmask admin-token $$role $$role --stdin < $(SECRETS)/$$role-token >> $@.new || exit 1; \
	done
	@mv $@.new $@ && chmod 644 $@
	@echo "generated $@ (tokens in $(SECRETS)/operator-token and $(SECRETS)/recommender-token)"

# podman-compose comes with the dev extras (make setup); PODMAN_COMPOSE=PATH uses another.
$(VENV)/bin/podman-compose: | $(STAMP)

# Containers on machines whose TLS to PyPI fails cannot fetch ML-100K: when the
# host has fetched it (`fedmask data fetch ml-100k`), it is copied into the
# data volume before the first start. Elsewhere the clients fetch it themselves.
ADMIN_PORT ?= 8080
up: $(PODMAN_COMPOSE) images $(SECRET_FILES)
	@if [ -d data/ml-100k ] && ! $(PODMAN) volume exists fedmask_data; then \
	    $(PODMAN) volume create fedmask_data >/dev/null && \
	    $(PODMAN) run --rm --entrypoint cp -v fedmask_data:/var/lib/fedmask/data -v $(CURDIR)/data/ml-100k:/src:ro \
	        $(IMAGE_PREFIX)fedmask-client:$(CLIENT_TAG) -r /src /var/lib/fedmask/data/ml-100k && \
	    echo "copied data/ml-100k into the volume fedmask_data"; fi
	$(COMPOSE_ENV) FEDMASK_ADMIN_PORT=$(ADMIN_PORT) $(COMPOSE) up -d
	@echo
	@echo "fedmask is starting: PostgreSQL, certificates, the coordinator (mTLS), the admin service and two edge clients."
	@echo "  dashboard: http://127.0.0.1:$(ADMIN_PORT)/   (paste the token of $(SECRETS)/operator-token)"
	@echo "  top-k:     curl -sS -H \"Authorization: Bearer \$$(cat $(SECRETS)/recommender-token)\" 'http://127.0.0.1:$(ADMIN_PORT)/v1/users/user-1/recommendations?k=5'"
	@echo "  ready:     curl -sS http://127.0.0.1:$(ADMIN_PORT)/readyz   (the first rounds take about a minute)"
	@echo "  logs:      $(COMPOSE) logs -f coordinator"
	@echo "  health:    $(PODMAN) exec fedmask_coordinator_1 fedmask health --address 127.0.0.1:50052"
	@echo "  rounds:    $(PODMAN) exec -e PGPASSWORD=\$$(cat $(SECRETS)/postgres-password) fedmask_postgres_1 psql -h 127.0.0.1 -U fedmask -c 'select number, state from rounds order by number'"
	@echo "  stop:      make down   (the volumes stay; secrets and tokens in $(SECRETS)/)"

down: $(PODMAN_COMPOSE)
	$(COMPOSE_ENV) $(COMPOSE) down
