#!/usr/bin/env bash
# Makes throw-away TLS material with the openssl CLI, for tests and local trials (never for
# production: the keys are unprotected and the CAs are made on the spot).
# Usage: deploy/make-test-certs.sh DIR
# Writes into DIR (created if needed), every key EC P-256, every certificate PEM:
#   ca.pem ca.key              the CA trusted by clients and, for mutual TLS, by the server
#   other-ca.pem other-ca.key  a CA nobody trusts (wrong-CA cases)
#   server.pem server.key      server certificate: DNS localhost, IP 127.0.0.1-4; signed by ca
#   server2.pem server2.key    a second, equally valid server certificate (rotation)
#   server-untrusted.pem/.key  the same names, signed by other-ca
#   server-expired.pem/.key    signed by ca, validity ended in 2020
#   server-future.pem/.key     signed by ca, valid only from 2090
#   server-wrongname.pem/.key  signed by ca, for DNS wrong.example only
#   client.pem client.key      client certificate (CN attnserve-client) signed by ca
#   client-untrusted.pem/.key  client certificate signed by other-ca
set -euo pipefail
dir=${1:?usage: make-test-certs.sh DIR}
mkdir -p "$dir"
cd "$dir"

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

make_ca() {  # name subject
  newkey "$1.key"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 30 -out "$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}

# `openssl ca` rather than `x509 -req`: only it sets arbitrary validity dates (expired, future).
cat > ca.cnf <<'CNF'
[ca]
default_ca = test_ca
[test_ca]
database = index.txt
new_certs_dir = issued
serial = serial
default_md = sha256
policy = any
copy_extensions = copy
unique_subject = no
[any]
commonName = supplied
CNF

sign() {  # name ca subject san startdate enddate extended-key-usage
  newkey "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$3" -out "$1.csr" ${4:+-addext "subjectAltName=$4"}
  : > index.txt && mkdir -p issued
  openssl rand -hex 16 > serial
  openssl ca -batch -config ca.cnf -cert "$2.pem" -keyfile "$2.key" -in "$1.csr" \
    -out "$1.pem" -notext -startdate "$5" -enddate "$6" \
    -extfile <(printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=%s\n' "$7") 2>/dev/null
  rm -rf "$1.csr" index.txt* serial* issued
}

# Dates as openssl ca wants them: YYYYMMDDHHMMSSZ.
now=$(date -u -d '-1 hour' +%Y%m%d%H%M%SZ)
month=$(date -u -d '+30 days' +%Y%m%d%H%M%SZ)
names="DNS:localhost,IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,IP:127.0.0.4"

make_ca ca attnserve-test-ca
make_ca other-ca attnserve-untrusted-ca
sign server ca localhost "$names" "$now" "$month" serverAuth
sign server2 ca localhost "$names" "$now" "$month" serverAuth
sign server-untrusted other-ca localhost "$names" "$now" "$month" serverAuth
sign server-expired ca localhost "$names" 20200101000000Z 20200201000000Z serverAuth
sign server-future ca localhost "$names" 20900101000000Z 20900201000000Z serverAuth
sign server-wrongname ca wrong.example "DNS:wrong.example" "$now" "$month" serverAuth
sign client ca attnserve-client "" "$now" "$month" clientAuth
sign client-untrusted other-ca attnserve-client "" "$now" "$month" clientAuth
rm -f ca.cnf
