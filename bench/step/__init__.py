"""`pagedchat bench step`: where a decode step's time goes, at a few batch sizes."""
