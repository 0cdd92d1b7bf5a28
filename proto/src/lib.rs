//! Switchyard's gRPC contracts. The `.proto` files are the source of truth and their
//! comments document every field; this crate only exposes the generated code.

#![allow(missing_debug_implementations)]

/// The encoded `FileDescriptorSet` of every Switchyard proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/switchyard_descriptor.bin"));

/// The largest Cache answer (`switchyard.watcher.v1.Cache`) a watcher sends and a reader
/// must decode: one object as large as an apiserver with a raised etcd request limit may
/// store. List answers are cut into messages of about 1 MiB; only a larger object is alone in
/// a larger one.
pub const MAX_CACHE_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A `google.protobuf.Duration` from the network as a `std::time::Duration`, or `None` when it
/// is negative. Unlike `TryFrom`, it never panics: prost's conversion negates the seconds
/// of a negative duration, which overflows for `i64::MIN` (a panic in a debug build). Nanos
/// outside their range carry into the seconds, as protobuf's normalization does.
pub fn duration(d: prost_types::Duration) -> Option<std::time::Duration> {
    const NANOS: i128 = 1_000_000_000;
    let total = i128::from(d.seconds) * NANOS + i128::from(d.nanos);
    let seconds = u64::try_from(total.div_euclid(NANOS)).ok()?;
    let nanos = u32::try_from(total.rem_euclid(NANOS)).ok()?;
    Some(std::time::Duration::new(seconds, nanos))
}

pub mod common {
    pub mod v1 {
        tonic::include_proto!("switchyard.common.v1");
    }
}

pub mod queue {
    pub mod v1 {
        tonic::include_proto!("switchyard.queue.v1");
    }
}

pub mod elector {
    pub mod v1 {
        tonic::include_proto!("switchyard.elector.v1");
    }
}

pub mod watcher {
    pub mod v1 {
        tonic::include_proto!("switchyard.watcher.v1");
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    #[test]
    fn descriptor_set_names_every_service() {
        let set = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET)
            .expect("descriptor set decodes");
        let mut services: Vec<String> = set
            .file
            .iter()
            .flat_map(|f| {
                let package = f.package().to_owned();
                f.service
                    .iter()
                    .map(move |s| format!("{package}.{}", s.name()))
            })
            .collect();
        services.sort();
        assert_eq!(
            services,
            [
                "switchyard.elector.v1.Elector",
                "switchyard.queue.v1.Queue",
                "switchyard.watcher.v1.Cache",
                "switchyard.watcher.v1.Watches",
            ]
        );
    }

    #[test]
    fn durations_convert_without_panicking_whatever_their_fields() {
        let d = |seconds, nanos| super::duration(prost_types::Duration { seconds, nanos });
        assert_eq!(d(1, 500), Some(std::time::Duration::new(1, 500)));
        assert_eq!(d(2, -1), Some(std::time::Duration::new(1, 999_999_999)));
        assert_eq!(d(0, 2_000_000_001), Some(std::time::Duration::new(2, 1)));
        assert_eq!(
            d(i64::MAX, i32::MAX),
            Some(std::time::Duration::new(i64::MAX as u64 + 2, 147_483_647))
        );
        for (seconds, nanos) in [(-1, 0), (0, -1), (i64::MIN, 0), (i64::MIN, i32::MIN)] {
            assert_eq!(d(seconds, nanos), None, "{seconds} s {nanos} ns");
        }
    }

    #[test]
    fn work_key_round_trips() {
        let key = super::common::v1::WorkKey {
            controller: "apps/v1/ReplicaSet".into(),
            namespace: "default".into(),
            name: "web-5d8f".into(),
        };
        let decoded = super::common::v1::WorkKey::decode(key.encode_to_vec().as_slice())
            .expect("work key decodes");
        assert_eq!(decoded, key);
    }
}
