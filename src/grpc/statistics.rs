//! The statistics extension over gRPC: the same numbers as `GET /v2/models/stats`
//! (`gateway::observe::Stats`), in ModelStatisticsResponse.

use serde_json::Value;

use crate::protocol::grpc::pb;

fn duration(v: &Value) -> Option<pb::StatisticDuration> {
    Some(pb::StatisticDuration {
        count: v["count"].as_u64().unwrap_or(0),
        ns: v["ns"].as_u64().unwrap_or(0),
    })
}

/// Reads `{"model_stats": [...]}` as the statistics module writes it.
pub fn from_json(json: &Value) -> pb::ModelStatisticsResponse {
    let model_stats = json["model_stats"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|m| {
            let s = &m["inference_stats"];
            pb::ModelStatistics {
                name: m["name"].as_str().unwrap_or_default().to_string(),
                version: m["version"].as_str().unwrap_or_default().to_string(),
                last_inference: m["last_inference"].as_u64().unwrap_or(0),
                inference_count: m["inference_count"].as_u64().unwrap_or(0),
                execution_count: m["execution_count"].as_u64().unwrap_or(0),
                inference_stats: Some(pb::InferStatistics {
                    success: duration(&s["success"]),
                    fail: duration(&s["fail"]),
                    queue: duration(&s["queue"]),
                    compute_input: duration(&s["compute_input"]),
                    compute_infer: duration(&s["compute_infer"]),
                    compute_output: duration(&s["compute_output"]),
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect();
    pb::ModelStatisticsResponse { model_stats }
}
