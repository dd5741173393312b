"""Plotly figures (data in, figure out), the static report and the served Dash app. Reads through db/ only."""
