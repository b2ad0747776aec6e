"""Tests of the embedded demo (lrft.demo)."""
