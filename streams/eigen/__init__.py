"""EigenData track (EigenData §4): eigen.seeds -> intents -> tasks -> dialogs -> dialogs.validated -> verified."""
