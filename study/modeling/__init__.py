"""What is trained: the GPT decoder with its pluggable attention (``model``), its diagnostics
(``diagnostics``) and the LightningModule that trains it (``lit_module``).  No stage lives here."""
