"""What is trained: the GPT decoder with its pluggable attention (``model``), its diagnostics
(``diagnostics``) and the LightningModule that trains it (``lm``).  No stage lives here."""
