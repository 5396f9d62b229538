"""The Streamlit entry point: ``streamlit run dashboards/app.py -- --db FILE`` (``sparkgate dashboard``
builds that command). The app's own arguments follow ``--``; see ``context.parse_args``."""
from __future__ import annotations

import sys

import streamlit as st

from dashboards import context

st.set_page_config(page_title="sparkgate", layout="wide")
PAGES = [
    st.Page("pages/rollout.py", title="Rollout", default=True),
    st.Page("pages/calibration.py", title="Calibration"),
    st.Page("pages/acceptance.py", title="Acceptance"),
    st.Page("pages/tiers.py", title="Tiers and cost"),
    st.Page("pages/fleet.py", title="Fleet"),
]
# The sidebar's own widgets come first, so they are not redrawn below the page list on every page.
ready = context.build(sys.argv[1:]) is not None
navigation = st.navigation(PAGES)
if ready:
    navigation.run()
