"""Tests of the embedded demo (lrft.demos)."""
