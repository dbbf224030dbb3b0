"""Tests of frost.models (a package, so that module names do not clash with other test folders)."""
