//! Shared set-up of the measurement examples: the cluster to measure.

use anyhow::Context;
use talon_meta::testing::TestCluster;

/// The cluster to measure: the running one at `cluster` (comma-separated host:port), or an
/// in-process one of `nodes` nodes (8 partitions, replication min(3, nodes)). Returns the
/// in-process cluster, to shut down at the end, and the seed addresses.
pub async fn cluster_to_measure(
    cluster: Option<&str>,
    nodes: u64,
) -> anyhow::Result<(Option<TestCluster>, Vec<String>)> {
    match cluster {
        Some(c) => Ok((None, talon_client::cli::seeds(c))),
        None => {
            let cluster = TestCluster::builder()
                .nodes(nodes)
                .partitions(8)
                .replication(nodes.min(3) as u32)
                .start()
                .await
                .context("start an in-process cluster")?;
            let addrs = cluster.addrs();
            Ok((Some(cluster), addrs))
        }
    }
}
