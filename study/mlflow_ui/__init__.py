"""What a researcher opens to compare runs: the MLflow UI on the project's own store (``python -m study.ui``,
``make ui``) and its check in a real headless browser (``make ui-check``).

  server.py         the ``mlflow server`` process, the study's shared runs view, the runs the store holds
  browser_check.py  the runs table loaded in headless Chromium (Playwright) and compared with the store

Above the runner (it reads the store's place from study.runfolder.store and study.runner.tracking), below the stages.
"""
