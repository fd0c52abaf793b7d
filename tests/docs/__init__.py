"""The documentation run as tests: tests.docs.harness."""
