//! symm-driver
