"""The machinery the stages share to run and track a training run: world size and strategy
(``world``), the run folder's lock, resume key and MLflow ending (``run_state``), progress lines
(``logs``), MLflow (``tracking``), throughput loops (``throughput``), a run's frozen
specification (``spec``: derived tokens and lr), arms' runs (``arms``).  No stage lives here."""
