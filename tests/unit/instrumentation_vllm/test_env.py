from __future__ import annotations

import dataclasses
import math

import pytest
from memest_instrumentation.vllm.env import ENV_VARS, Settings, derive_run_id, help_text


def test_defaults_leave_the_plugin_off() -> None:
    s = Settings.from_env({})
    assert s.enabled is False
    assert s.estimate == "plan"
    assert s.output_dir == "memest-out"
    assert s.problems == ()


def test_the_defaults_are_declared_once() -> None:
    """Settings() and an empty environment agree: both take ENV_VARS' defaults."""
    assert Settings() == Settings.from_env({})
    assert Settings().plan_free_tolerance_bytes == 256 << 20  # ENV_VARS' "268435456"


def test_every_setting_is_read_and_documented() -> None:
    env = {
        "MEMEST_ENABLE": "1",
        "MEMEST_OUTPUT_DIR": "/data/reports",
        "MEMEST_RUN_ID": "run-7",
        "MEMEST_SERVICE_URL": "http://memest:8080/",
        "MEMEST_TOKEN": "secret",
        "MEMEST_PUSH_TIMEOUT_S": "2.5",
        "MEMEST_PUSH_RETRIES": "5",
        "MEMEST_HISTORY_MAX_ENTRIES": "1000",
        "MEMEST_RULES": "rules.toml",
        "MEMEST_HISTORY_FROM": "init",
        "MEMEST_ESTIMATE": "APPLY",
        "MEMEST_MARGIN_BYTES": "1048576",
        "MEMEST_PLAN_FREE_TOLERANCE_BYTES": "0",
        "MEMEST_FAULT": "capture, push",
    }
    s = Settings.from_env(env)
    assert (s.enabled, s.output_dir, s.run_id) == (True, "/data/reports", "run-7")
    assert s.service_url == "http://memest:8080"
    assert (s.token, s.push_timeout_s, s.push_retries) == ("secret", 2.5, 5)
    assert (s.history_max_entries, s.rules_file) == (1000, "rules.toml")
    assert (s.estimate, s.margin_bytes, s.plan_free_tolerance_bytes) == ("apply", 1 << 20, 0)
    assert s.faults == frozenset({"capture", "push"})
    assert s.history_from == "init"
    documented = {v.name for v in ENV_VARS}
    assert set(env) <= documented
    text = help_text()
    for name in documented:
        assert name in text


def test_bad_values_keep_defaults_and_are_named() -> None:
    s = Settings.from_env(
        {"MEMEST_ENABLE": "1", "MEMEST_PUSH_RETRIES": "zero", "MEMEST_ESTIMATE": "guess"}
    )
    assert s.enabled and s.push_retries == 3 and s.estimate == "plan"
    assert any("MEMEST_PUSH_RETRIES='zero'" in p for p in s.problems)
    assert any("MEMEST_ESTIMATE='guess'" in p for p in s.problems)


def test_plan_path_split_is_on_by_default_and_takes_only_0_or_1() -> None:
    assert Settings.from_env({}).plan_path_split is True
    assert Settings.from_env({"MEMEST_PLAN_PATH_SPLIT": "0"}).plan_path_split is False
    s = Settings.from_env({"MEMEST_PLAN_PATH_SPLIT": "off"})
    assert s.plan_path_split is True
    assert s.problems == ("MEMEST_PLAN_PATH_SPLIT='off': expected 0 or 1",)


def test_run_id_is_shared_by_ranks_of_one_launch() -> None:
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    a = derive_run_id(env, parent_pid=4242)
    b = derive_run_id(dict(env), parent_pid=4242)
    other_launch = derive_run_id({**env, "MASTER_PORT": "29501"}, parent_pid=4242)
    assert a == b and a.startswith("run-")
    assert a != other_launch
    assert derive_run_id({"MEMEST_RUN_ID": "mine"}, parent_pid=1) == "mine"


# Every numeric setting with its documented default (README's table), written out by hand.
NUMERIC_DEFAULTS: dict[str, float] = {
    "MEMEST_PUSH_TIMEOUT_S": 10.0,
    "MEMEST_PUSH_RETRIES": 3,
    "MEMEST_HISTORY_MAX_ENTRIES": 2_000_000,
    "MEMEST_MARGIN_BYTES": 0,
    "MEMEST_PLAN_FREE_TOLERANCE_BYTES": 268_435_456,
    "MEMEST_WORK_BUDGET_S": 60.0,
    "MEMEST_SLOW_HOOK_S": 20.0,
}
_FIELD = {
    "MEMEST_PUSH_TIMEOUT_S": "push_timeout_s",
    "MEMEST_PUSH_RETRIES": "push_retries",
    "MEMEST_HISTORY_MAX_ENTRIES": "history_max_entries",
    "MEMEST_MARGIN_BYTES": "margin_bytes",
    "MEMEST_PLAN_FREE_TOLERANCE_BYTES": "plan_free_tolerance_bytes",
    "MEMEST_WORK_BUDGET_S": "work_budget_s",
    "MEMEST_SLOW_HOOK_S": "slow_hook_s",
}


def test_the_numeric_settings_listed_here_are_all_of_them() -> None:
    numeric = {
        f.name
        for f in dataclasses.fields(Settings)
        if f.type in ("int", "float") or f.type in (int, float)
    }
    assert numeric == set(_FIELD.values())


@pytest.mark.parametrize("name", sorted(NUMERIC_DEFAULTS))
@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "-1", "1e999"])
def test_a_numeric_setting_that_is_not_finite_or_is_negative_keeps_its_default(
    name: str, text: str
) -> None:
    s = Settings.from_env({name: text})
    value = getattr(s, _FIELD[name])
    assert value == NUMERIC_DEFAULTS[name] and math.isfinite(value)
    (problem,) = s.problems
    assert problem.startswith(f"{name}={text!r}: expected a")


def test_run_id_that_is_not_a_folder_name_falls_back_with_a_warning() -> None:
    s = Settings.from_env({"MEMEST_RUN_ID": "../../x"})
    assert s.run_id == ""
    (problem,) = s.problems
    assert problem.startswith("MEMEST_RUN_ID='../../x': expected 1-128 letters")
    assert problem.endswith("a run id derived for this launch is used instead")
    derived = derive_run_id({"MEMEST_RUN_ID": "../../x"}, parent_pid=4242)
    assert derived == derive_run_id({}, parent_pid=4242) and derived.startswith("run-")
    assert Settings.from_env({"MEMEST_RUN_ID": "S_llama8b.apply-1"}).run_id == "S_llama8b.apply-1"


def test_a_bad_run_id_is_warned_about_and_replaced_inside_vllm(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memest_instrumentation.vllm import state as state_module

    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("MEMEST_RUN_ID", "../../x")
    monkeypatch.setattr(state_module, "_STATE", None)
    with caplog.at_level("WARNING"):
        st = state_module.state()
    assert st.run_id.startswith("run-")
    assert any("MEMEST_RUN_ID='../../x'" in e for e in st.hook_errors)
    assert "MEMEST_RUN_ID='../../x'" in caplog.text
    monkeypatch.setattr(state_module, "_STATE", None)


def test_each_bad_setting_is_one_warning_naming_it_and_the_push_keeps_its_default(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A junk service URL and an out-of-range push timeout: one warning line each (not only the
    first), vLLM's start goes on, and the push keeps its 10 s timeout rather than being dropped."""
    from memest_instrumentation.vllm import state as state_module

    monkeypatch.setenv("MEMEST_ENABLE", "1")
    monkeypatch.setenv("MEMEST_SERVICE_URL", "not a url")
    monkeypatch.setenv("MEMEST_PUSH_TIMEOUT_S", "9.3e9")
    monkeypatch.setattr(state_module, "_STATE", None)
    with caplog.at_level("WARNING"):
        st = state_module.state()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    url, timeout = sorted(warnings, key=lambda w: "MEMEST_PUSH_TIMEOUT_S" in w)
    assert "MEMEST_SERVICE_URL='not a url'" in url and "not pushed" in url
    assert "MEMEST_PUSH_TIMEOUT_S='9.3e9'" in timeout and "at most 600" in timeout
    assert timeout.endswith("the default 10 is used")
    assert st.settings.push_timeout_s == 10.0 and st.settings.service_url == ""
    assert len(st.hook_errors) == 2
    monkeypatch.setattr(state_module, "_STATE", None)


@pytest.mark.parametrize("url", ["ftp://x", "http://", "not a url", "http://h:99999", "http://h?x"])
def test_a_junk_service_url_is_named_and_never_raises(url: str) -> None:
    s = Settings.from_env({"MEMEST_SERVICE_URL": url})
    assert s.service_url == ""
    (problem,) = s.problems
    assert problem.startswith(f"MEMEST_SERVICE_URL={url!r}: ")
