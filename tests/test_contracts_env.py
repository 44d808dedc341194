"""The recording contract's switches (dpro.contracts.recording.env_flag)."""

import pytest

from dpro.contracts.recording import env_flag


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), (" YES ", True), ("True", True),
                                      ("0", False), ("no", False), ("", False), ("2", False), ("on", False)])
def test_env_flag(value, on):
    assert env_flag("X", {"X": value}) is on
    assert env_flag("Y", {"X": value}) is False


def test_env_flag_reads_os_environ(monkeypatch):
    monkeypatch.setenv("DPRO_TEST_FLAG", "yes")
    assert env_flag("DPRO_TEST_FLAG")
    monkeypatch.delenv("DPRO_TEST_FLAG")
    assert not env_flag("DPRO_TEST_FLAG")
