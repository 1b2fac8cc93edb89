//! The API's errors: JSON `{"code": "...", "message": "..."}` under an HTTP status, 4xx for the
//! caller's mistakes and 5xx for the node's. The node's own refusals ([`RdmaError`]) get their
//! status here, from their kind: nothing below the API knows HTTP.

use crate::rdma::{RdmaError, Refusal};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Why a request was refused, as the API answers it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// What went wrong, for people.
    pub message: String,
}

impl ApiError {
    /// 400: the request itself is wrong.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        RdmaError::bad(code, message).into()
    }
    /// 404: no such object.
    pub fn not_found(what: impl Into<String>) -> Self {
        RdmaError::not_found(what).into()
    }
    /// 409: the object's state does not allow it.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        RdmaError::conflict(code, message).into()
    }
    /// 503 (an lcore that does not answer) or 500: the node could not do it.
    pub fn internal(code: &'static str, message: impl Into<String>) -> Self {
        RdmaError::internal(code, message).into()
    }
}

impl From<RdmaError> for ApiError {
    fn from(e: RdmaError) -> Self {
        let status = match e.kind {
            Refusal::Invalid => 400,
            Refusal::NotFound => 404,
            Refusal::Conflict => 409,
            Refusal::Unavailable => 503,
            Refusal::TimedOut => 504,
            Refusal::Expired => 408,
            Refusal::Internal => 500,
        };
        ApiError {
            status,
            code: e.code,
            message: e.message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            axum::Json(json!({"code": self.code, "message": self.message})),
        )
            .into_response()
    }
}
