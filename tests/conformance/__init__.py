"""The conformance kit: every ``conf/reducer/*.yaml`` joins every check by itself (docs/testing.md)."""
