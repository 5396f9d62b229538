"""Read-only Streamlit views over what the collectors and controller stored."""
