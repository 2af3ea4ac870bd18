"""The machinery the stages share to run and track a training run: world size and strategy
(``world``), the run folder's lock, resume key and MLflow ending (``run_state``), progress lines
(``logs``), MLflow (``tracking``, ``mlflow_ui``), throughput loops (``throughput``), the scale
ladder's and arms' run settings (``budget``, ``arms``).  No stage lives here."""
