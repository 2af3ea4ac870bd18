"""The machinery the stages share to run and track a training run: world size and strategy
(``world``), the run folder's state at a start and a run's ending (``run_state``), its resume key (``resume_key``),
Lightning's loop state across a resume (``loop_state``), progress lines
(``logs``), MLflow (``tracking``), throughput loops (``throughput``), a run's frozen
specification (``spec``: derived tokens and lr), arms' runs (``arms``), SIGTERM as an exception (``signals``).  No
stage lives here."""
