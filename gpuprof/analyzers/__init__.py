"""Pure functions from a `Run` to tables and findings: no printing, plotting or I/O."""
