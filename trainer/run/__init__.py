"""Running jobs: the driver, one job's pipeline, the jobs, the ledger, planning and executors."""
