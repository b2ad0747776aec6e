"""Tests of the embedded demo (lrft.trainer.demo)."""
