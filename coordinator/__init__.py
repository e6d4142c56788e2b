"""The gRPC coordinator: enrolment, cohort selection and secure-aggregation rounds (docs/architecture.md)."""
