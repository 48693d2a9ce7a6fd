"""The tests of an optional extra skip where it is missing, but fail in CI (which installs all)."""

import sys

import pytest

from tests.extras import import_extra


def test_missing_extra_skips_outside_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # `import apache_beam` fails
    with pytest.raises(pytest.skip.Exception, match=r"pip install -e '\.\[beam\]'"):
        import_extra("apache_beam", "beam")


def test_missing_extra_fails_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setitem(sys.modules, "apache_beam", None)
    with pytest.raises(ImportError):
        import_extra("apache_beam", "beam")


def test_installed_extra_is_returned(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert import_extra("json", "none").dumps([1]) == "[1]"
