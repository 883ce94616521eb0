#!/bin/sh
# One-shot service `minio-init` of docker-compose.yaml (image minio/mc): the warehouse bucket
# named by LAKEHOUSE_WAREHOUSE (s3://BUCKET/...), and the platform's own MinIO user, allowed
# that bucket only. Idempotent: every `docker compose up` runs it again.
#
# Environment: MINIO_ROOT_USER, MINIO_ROOT_PASSWORD (the server's admin), MINIO_LAKEHOUSE_USER,
# MINIO_LAKEHOUSE_PASSWORD (the platform's access key and secret), LAKEHOUSE_WAREHOUSE,
# LAKEHOUSE_S3_ENDPOINT (the same values the platform uses).
set -eu

: "${MINIO_ROOT_USER:?set MINIO_ROOT_USER in .env}"
: "${MINIO_ROOT_PASSWORD:?set MINIO_ROOT_PASSWORD in .env}"
: "${MINIO_LAKEHOUSE_USER:?set MINIO_LAKEHOUSE_USER in .env}"
: "${MINIO_LAKEHOUSE_PASSWORD:?set MINIO_LAKEHOUSE_PASSWORD in .env}"
: "${LAKEHOUSE_WAREHOUSE:?LAKEHOUSE_WAREHOUSE is not set}"
: "${LAKEHOUSE_S3_ENDPOINT:?LAKEHOUSE_S3_ENDPOINT is not set}"

case "$LAKEHOUSE_WAREHOUSE" in
    s3://?*|s3a://?*) ;;
    *) echo "minio-init: LAKEHOUSE_WAREHOUSE=$LAKEHOUSE_WAREHOUSE is not an s3:// location" >&2; exit 2 ;;
esac
location="${LAKEHOUSE_WAREHOUSE#*://}"
bucket="${location%%/*}"

mc alias set lakehouse "$LAKEHOUSE_S3_ENDPOINT" "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
mc mb --ignore-existing "lakehouse/$bucket"

# Table data and metadata only: list the bucket, read, write and delete its objects.
policy="${TMPDIR:-/tmp}/lakehouse-warehouse-policy.json"
cat >"$policy" <<JSON
{
  "Version": "2012-10-17",
  "Statement": [
    {"Effect": "Allow", "Action": ["s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"],
     "Resource": ["arn:aws:s3:::$bucket"]},
    {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                                   "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
     "Resource": ["arn:aws:s3:::$bucket/*"]}
  ]
}
JSON
mc admin policy create lakehouse lakehouse-warehouse "$policy" >/dev/null
mc admin user add lakehouse "$MINIO_LAKEHOUSE_USER" "$MINIO_LAKEHOUSE_PASSWORD" >/dev/null
# Attaching a policy the user already has fails; on a rerun that is the expected state.
if ! attach="$(mc admin policy attach lakehouse lakehouse-warehouse --user "$MINIO_LAKEHOUSE_USER" 2>&1)"; then
    case "$attach" in
        *"already"*) ;;
        *) echo "minio-init: $attach" >&2; exit 1 ;;
    esac
fi
echo "minio-init: bucket $bucket ready for user $MINIO_LAKEHOUSE_USER"
