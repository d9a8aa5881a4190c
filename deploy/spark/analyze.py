"""The toolproxy analyzer as a Spark application, for spark-submit:

    spark-submit --master spark://HOST:7077 deploy/spark/analyze.py \
        --data /shared/toolproxy-data --out /shared/toolproxy-analysis --format json --output report.json

Everything happens in toolproxy.analysis.export.spark (installed with `pip install 'toolproxy-recorder[spark]'`
on the driver and every executor); this file only gives spark-submit a script to run.
"""

import sys

from toolproxy.analysis.export.spark import main

sys.exit(main())
