"""Tests of frost.nn and frost.models (a package, so that module names do not clash with tests/ops)."""
