"""Tests of frost.text (a package, so that module names do not clash with other test folders)."""
