"""The Streamlit entry point: ``streamlit run dashboards/app.py -- --db FILE`` (``sparkgate dashboard``
builds that command). The app's own arguments follow ``--``; see ``context.parse_args``."""

from __future__ import annotations

import sys

import streamlit as st

from sparkgate.dashboards import context

st.set_page_config(page_title="sparkgate", layout="wide")
PAGES = [
    st.Page("views/rollout.py", title="Rollout", default=True),
    st.Page("views/calibration.py", title="Calibration"),
    st.Page("views/acceptance.py", title="Acceptance"),
    st.Page("views/tiers.py", title="Tiers and cost"),
    st.Page("views/fleet.py", title="Fleet"),
]
# Pages live in views/, not pages/: Streamlit would also run a pages/ folder as its own multipage app.
navigation = st.navigation(PAGES)
if context.build(sys.argv[1:]) is not None:
    navigation.run()
