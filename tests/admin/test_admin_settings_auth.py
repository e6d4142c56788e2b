"""Admin settings (flags > env > TOML > defaults; secrets never from
flags; problems listed without echoing secrets), token hashing and role
checks, and `fedmask admin-token`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from admin.auth import OPERATE, READ, TOP_K, Forbidden, TokenTable, Unauthenticated, bearer_token, token_hash
from admin.settings import AdminSettings, Role, SettingsError, TokenEntry
from fedmask.cli import app as cli

SECRET = "s3cret-coordinator-credential-value"


def entry(name: str, role: Role, token: str) -> TokenEntry:
    return TokenEntry(name=name, role=role, sha256=token_hash(token))


def test_sources_in_order_of_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "admin.toml"
    config.write_text(f'listen_address = "127.0.0.1:9000"\npage_size = 20\n[coordinator]\naddress = "127.0.0.1:7000"\n'
                      f'[[tokens]]\nname = "ops"\nrole = "operator"\nsha256 = "{token_hash("t" * 40)}"\n')
    monkeypatch.setenv("FEDMASK_ADMIN_PAGE_SIZE", "30")
    monkeypatch.setenv("FEDMASK_ADMIN_COORDINATOR__TOKEN", SECRET)
    s = AdminSettings.load(config_file=config, overrides={"listen_address": "127.0.0.1:9100", "page_size": None})
    assert s.listen_address == "127.0.0.1:9100"  # flag over file
    assert s.page_size == 30  # env over file
    assert s.coordinator.address == "127.0.0.1:7000"  # file over default
    assert s.coordinator.token is not None and s.coordinator.token.get_secret_value() == SECRET
    assert [t.name for t in s.tokens] == ["ops"] and s.tokens[0].role is Role.OPERATOR
    assert SECRET not in repr(s)


def test_secrets_are_refused_as_flags() -> None:
    for key in ("coordinator.token", "tokens"):
        with pytest.raises(SettingsError, match="never from a flag"):
            AdminSettings.load(overrides={key: "x"})


def test_every_problem_is_listed_and_secrets_are_not_echoed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDMASK_ADMIN_COORDINATOR__TOKEN", SECRET)
    config = tmp_path / "bad.toml"
    config.write_text('listen_address = "nowhere"\npage_size = 0\ntypo = 1\n[coordinator]\naddress = "10.0.0.5:50052"\n'
                      '[[tokens]]\nname = "a b"\nrole = "king"\nsha256 = "abc"\n')
    with pytest.raises(SettingsError) as err:
        AdminSettings.load(config_file=config)
    text = str(err.value)
    for needle in ("listen_address", "page_size", "typo", "tokens.0.name", "tokens.0.role", "tokens.0.sha256",
                   "in clear"):
        assert needle in text, (needle, text)
    assert SECRET not in text and "abc" not in text


def test_duplicate_token_names_or_hashes_are_refused() -> None:
    a, b = entry("a", Role.VIEWER, "x" * 40), entry("a", Role.OPERATOR, "y" * 40)
    with pytest.raises(ValueError, match="unique"):
        AdminSettings(tokens=[a, b])
    with pytest.raises(ValueError, match="twice"):
        AdminSettings(tokens=[a, entry("b", Role.OPERATOR, "x" * 40)])


def test_roles_and_tokens() -> None:
    table = TokenTable([entry("v", Role.VIEWER, "v" * 40), entry("r", Role.RECOMMENDER, "r" * 40),
                        entry("o", Role.OPERATOR, "o" * 40)])
    assert table.authorize("Bearer " + "v" * 40, READ).name == "v"
    assert table.authorize("bearer  " + "o" * 40, OPERATE).role is Role.OPERATOR
    assert table.authorize("Bearer " + "r" * 40, TOP_K).name == "r"
    with pytest.raises(Forbidden):
        table.authorize("Bearer " + "r" * 40, READ)
    with pytest.raises(Forbidden):
        table.authorize("Bearer " + "v" * 40, OPERATE)
    for header in (None, "", "Bearer", "Basic " + "v" * 40, "Bearer " + "v" * 39, "Bearer " + "V" * 40):
        with pytest.raises(Unauthenticated):
            table.authorize(header, READ)
    assert bearer_token("Bearer abc ") == "abc"


def test_admin_token_command_prints_a_usable_entry() -> None:
    result = CliRunner().invoke(cli, ["admin-token", "ops", "operator", "--json"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    token = next(line.split(": ", 1)[1] for line in lines if line.startswith("token (shown once)"))
    data = json.loads(next(line for line in lines if line.startswith("{")))
    assert data == {"name": "ops", "role": "operator", "sha256": token_hash(token)}
    table = TokenTable([TokenEntry.model_validate(data)])
    assert table.authorize(f"Bearer {token}", OPERATE).name == "ops"
    short = CliRunner().invoke(cli, ["admin-token", "ops", "operator", "--stdin"], input="short\n")
    assert short.exit_code == 2 and "at least 32" in short.output
    bad_role = CliRunner().invoke(cli, ["admin-token", "ops", "king"])
    assert bad_role.exit_code != 0


def test_fedmask_admin_refuses_bad_settings_and_a_missing_store(tmp_path: Path) -> None:
    missing = CliRunner().invoke(cli, ["admin", "--database-url", f"sqlite:///{tmp_path / 'absent.db'}"])
    assert missing.exit_code == 2 and "cannot open the store" in missing.output
    assert not (tmp_path / "absent.db").exists()
    bad = CliRunner().invoke(cli, ["admin", "--listen", "nowhere", "--coordinator", "x"])
    assert bad.exit_code == 2 and "listen_address" in bad.output and "coordinator.address" in bad.output
    helped = CliRunner().invoke(cli, ["admin", "--help"])
    assert helped.exit_code == 0 and "FEDMASK_ADMIN_COORDINATOR__TOKEN" in helped.output
